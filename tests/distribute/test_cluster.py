"""The cluster description: TF_CONFIG and SLURM parsing, roles, and every malformed input as one
ConfigError line. Pure Python except the last tests, which compare with TensorFlow's own
resolvers (one TensorFlow import, shared)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc

import pytest
from conftest import fresh_env

from mirrorfit.distribute.cluster import Cluster, resolve_cluster
from mirrorfit.distribute.slurm import MAX_SLURM_TASKS, expand_hostlist, expand_tasks_per_node
from mirrorfit.errors import ConfigError


def tf_config(cluster, task_type="worker", index=0, **extra):
    return {
        "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": task_type, "index": index}, **extra}
        )
    }


def slurm(procid, ntasks=4, nodes="gn[10-11]", per_node="2(x2)", **extra):
    return {
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        **extra,
    }


def test_module_does_not_import_tensorflow():
    code = (
        "import sys, mirrorfit.distribute.cluster, mirrorfit.distribute.launch; "
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=fresh_env()
    )
    assert out.stdout.strip() == "False"


def test_nothing_set_is_a_single_process_run():
    assert resolve_cluster({}) is None
    assert resolve_cluster({"TF_CONFIG": "  "}) is None  # a blank template value = unset
    # the batch script itself (job-level variables only) is one process, not task 0 of 4
    assert (
        resolve_cluster({"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "gn[1-4]"})
        is None
    )
    assert resolve_cluster(slurm(0, ntasks=1, nodes="gn1", per_node="1")) is None


def test_multi_worker_tf_config():
    c = resolve_cluster(tf_config({"worker": ["h0:2222", "h1:2222"]}, index=1))
    assert c == Cluster(workers=("h0:2222", "h1:2222"), task_index=1)
    assert (c.mode, c.num_workers, c.worker_rank, c.is_chief) == ("multi-worker", 2, 1, False)
    assert c.describe() == "worker 1 of 2 (TF_CONFIG)" and c.task_name() == "worker 1"
    assert resolve_cluster(tf_config({"worker": ["h0:1", "h1:1"]}, index=0)).is_chief
    assert json.loads(json.dumps(c.tf_config())) == json.loads(
        tf_config({"worker": ["h0:2222", "h1:2222"]}, index=1)["TF_CONFIG"]
    )
    assert c.address("worker", 0) == "h0:2222"
    with pytest.raises(ValueError, match="no task ps 0"):
        c.address("ps", 0)


def test_chief_job_in_multi_worker_mode_is_an_extra_first_worker():
    # TF (multi_worker_util.id_in_cluster): the chief is id 0, worker i is id i + 1.
    jobs = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}
    chief = resolve_cluster(tf_config(jobs, "chief", 0))
    worker = resolve_cluster(tf_config(jobs, "worker", 1))
    assert (chief.num_workers, chief.worker_rank, chief.is_chief) == (3, 0, True)
    assert (worker.worker_rank, worker.is_chief) == (2, False)
    assert worker.describe() == "worker 1, rank 2 of 3 (TF_CONFIG)"
    alone = resolve_cluster(tf_config({"chief": ["c:1"]}, "chief", 0))
    assert (alone.num_workers, alone.is_chief) == (1, True)


def test_parameter_server_tf_config():
    jobs = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1"]}
    chief, ps = resolve_cluster(tf_config(jobs, "chief")), resolve_cluster(tf_config(jobs, "ps"))
    worker = resolve_cluster(tf_config(jobs, "worker", "1"))  # templated manifests give "1"
    assert chief.mode == "parameter-server" and chief.num_workers == 2  # the chief coordinates
    assert (chief.is_chief, chief.worker_rank, ps.worker_rank, worker.worker_rank) == (
        True,
        None,
        None,
        1,
    )
    assert chief.describe() == "chief (coordinator) of 2 worker(s), 1 ps and a chief (TF_CONFIG)"
    assert ps.task_name() == "ps 0" and chief.task_name() == "chief"
    assert chief.tf_config()["cluster"] == jobs


@pytest.mark.parametrize(
    "value, words",
    [
        ("{not json", ["not valid JSON", "unset it"]),
        ("[1, 2]", ["must be a JSON object"]),
        (json.dumps({"task": {"type": "worker", "index": 0}}), ["no cluster"]),
        (json.dumps({"cluster": {"worker": ["h:1"]}}), ["no task"]),
        (json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"index": 0}}), ["no task"]),
        (json.dumps({"cluster": {"worker": []}, "task": {"type": "worker"}}), ["no worker"]),
        (
            json.dumps({"cluster": {"worker": "h:1"}, "task": {"type": "worker"}}),
            ["cluster.worker", "list"],
        ),
        (
            json.dumps(
                {"cluster": {"worker": ["h:1"], "evaluator": ["e:1"]}, "task": {"type": "worker"}}
            ),
            ["'evaluator'", "side-car"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "evaluator"}}),
            ["'evaluator'", "side-car"],
        ),
        (json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "boss"}}), ["'boss'"]),
        (
            json.dumps(
                {"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 2}}
            ),
            ["worker 2", "valid indices 0..1"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": -1}}),
            ["worker -1"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": "x"}}),
            ["'x'", "integer"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": True}}),
            ["True", "integer"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "ps"}}),
            ["ps 0", "none: the job is empty"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h"]}, "task": {"type": "worker"}}),
            ["cluster.worker[0] 'h'", "host:port"],
        ),
        (
            json.dumps({"cluster": {"worker": ["grpc://h:1"]}, "task": {"type": "worker"}}),
            ["'grpc://h:1'"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:0"]}, "task": {"type": "worker"}}),
            ["port 0", "1..65535"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:70000"]}, "task": {"type": "worker"}}),
            ["port 70000"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:1", "h:1"]}, "task": {"type": "worker"}}),
            ["'h:1' is both worker 0 and worker 1"],
        ),
        (
            json.dumps(
                {"cluster": {"chief": ["h:1"], "worker": ["h:1"]}, "task": {"type": "worker"}}
            ),
            ["'h:1' is both chief 0 and worker 0"],
        ),
        (
            json.dumps({"cluster": {"worker": ["h:1"], "ps": ["p:1"]}, "task": {"type": "worker"}}),
            ["parameter servers need a chief"],
        ),
        (
            json.dumps({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "chief"}}),
            ["no worker to compute"],
        ),
        (
            json.dumps({"cluster": {"chief": ["c:1", "d:1"]}, "task": {"type": "chief"}}),
            ["at most one chief"],
        ),
        (
            json.dumps({"cluster": {"chief": ["c:1"]}, "task": {"type": "chief", "index": 1}}),
            ["chief 1"],
        ),
        (
            json.dumps(
                {
                    "cluster": {"worker": ["h:1"]},
                    "task": {"type": "worker"},
                    "rpc_layer": "grpc+verbs",
                }
            ),
            ["rpc_layer 'grpc+verbs'"],
        ),
    ],
)
def test_malformed_tf_config_is_one_config_error_line(value, words):
    with pytest.raises(ConfigError) as info:
        resolve_cluster({"TF_CONFIG": value})
    text = str(info.value)
    assert "\n" not in text and "TF_CONFIG" in text
    for word in words:
        assert word in text


def test_ipv6_and_extra_keys_are_accepted():
    c = resolve_cluster(
        tf_config(
            {"worker": ["[::1]:2222", "[::1]:2223"]}, index=1, environment="cloud", rpc_layer="grpc"
        )
    )
    assert c.address("worker", 1) == "[::1]:2223"


def test_slurm_block_layout_as_tensorflow():
    # nodes sorted by name, consecutive ports from 8888 on each node, SLURM_PROCID -> position
    c = resolve_cluster(slurm(3, SLURMD_NODENAME="gn11", SLURM_LOCALID="1"))
    assert c.workers == ("gn10:8888", "gn10:8889", "gn11:8888", "gn11:8889")
    assert (c.task_index, c.source, c.describe()) == (3, "SLURM", "worker 3 of 4 (SLURM)")
    c = resolve_cluster(
        slurm(0, ntasks=3, nodes="b1,a1", per_node="2,1", MIRRORFIT_SLURM_PORT_BASE="9000")
    )
    assert c.workers == ("a1:9000", "b1:9000", "b1:9001")  # b1 keeps its 2 tasks when sorted
    # job-level variables fill in for step ones that srun did not set
    c = resolve_cluster(
        {
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_PROCID": "1",
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_TASKS_PER_NODE": "1(x2)",
        }
    )
    assert c.workers == ("n1:8888", "n2:8888") and c.task_index == 1


@pytest.mark.parametrize(
    "env, words",
    [
        (slurm(4), ["SLURM_PROCID=4", "SLURM_STEP_NUM_TASKS=4"]),
        (slurm("x"), ["SLURM_PROCID='x'"]),
        ({**slurm(0), "SLURM_STEP_NUM_TASKS": "two"}, ["SLURM_STEP_NUM_TASKS='two'"]),
        (slurm(0, nodes="gn[10-11"), ["SLURM_STEP_NODELIST='gn[10-11'", "hostlist"]),
        (slurm(0, nodes="gn[11-10]"), ["hostlist"]),
        (slurm(0, nodes="gn[1-2],,x"), ["hostlist"]),
        (slurm(0, per_node="2(x)"), ["SLURM_STEP_TASKS_PER_NODE='2(x)'"]),
        (slurm(0, per_node="2(x3)"), ["names 2 node(s)", "gives 3"]),
        (slurm(0, per_node="1(x2)"), ["SLURM_STEP_NUM_TASKS=4", "places 2"]),
        ({k: v for k, v in slurm(0).items() if k != "SLURM_STEP_NODELIST"}, ["none of"]),
        (slurm(0, MIRRORFIT_SLURM_PORT_BASE="65535"), ["exceeds 65535"]),
        (slurm(0, MIRRORFIT_SLURM_PORT_BASE="abc"), ["MIRRORFIT_SLURM_PORT_BASE='abc'"]),
        (slurm(1, SLURMD_NODENAME="gn11", SLURM_LOCALID="0"), ["--distribution=block"]),
    ],
)
def test_malformed_slurm_environment_is_one_config_error_line(env, words):
    with pytest.raises(ConfigError) as info:
        resolve_cluster(env)
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_tf_config_wins_over_slurm():
    env = {**slurm(1), **tf_config({"worker": ["a:1", "b:1"]}, index=0)}
    assert resolve_cluster(env).source == "TF_CONFIG"


def test_expansions():
    assert expand_hostlist("n[1-2],m5,o[03-04,6,7-9]") == [
        "n1",
        "n2",
        "m5",
        "o03",
        "o04",
        "o6",
        "o7",
        "o8",
        "o9",
    ]
    assert expand_hostlist("[1-2]") == ["1", "2"]
    with pytest.raises(ConfigError):
        expand_hostlist("[1-2]x")  # TF's grammar: a range only at the end of a name
    assert expand_tasks_per_node("3(x2),2,1") == [3, 3, 2, 1]


@pytest.mark.parametrize(
    "env, words",
    [
        (
            slurm(0, nodes="n[1-99999999]"),
            ["SLURM_STEP_NODELIST='n[1-99999999]' names 99999999 nodes", "SLURM_STEP_NUM_TASKS=4"],
        ),
        (slurm(0, nodes="n[1-3],m[1-2]"), ["names 5 nodes", "SLURM_STEP_NUM_TASKS=4"]),
        (
            slurm(0, per_node="1(x99999999)"),
            ["SLURM_STEP_TASKS_PER_NODE='1(x99999999)'", "names 99999999 nodes"],
        ),
        (slurm(0, per_node="99999999,1"), ["places 100000000 task(s)"]),  # addresses never made
        (
            slurm(0, ntasks=10**8, nodes="n[1-99999999]"),
            ["SLURM_STEP_NUM_TASKS=100000000", "cap of 65536"],
        ),
        (slurm(0, nodes="n[1-" + "9" * 5000 + "]"), ["hostlist"]),  # int()'s digit limit
        # a long host prefix times many names; numbers past int()'s 4,300 digits
        (
            dict(
                SLURM_STEP_NUM_TASKS="65536",
                SLURM_PROCID="0",
                SLURM_STEP_TASKS_PER_NODE="1(x65536)",
                SLURM_STEP_NODELIST="a" * 4000 + "[1-65536]",
            ),
            ["longer than 255"],
        ),
        (
            dict(
                SLURM_STEP_NUM_TASKS="2",
                SLURM_PROCID="0" * 4301,
                SLURM_STEP_TASKS_PER_NODE="1(x2)",
                SLURM_STEP_NODELIST="n[1-2]",
            ),
            ["SLURM_PROCID", "not an integer"],
        ),
        (
            {
                "TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": '
                + "1" * 4301
                + "}}"
            },
            ["TF_CONFIG is not valid JSON"],
        ),
        (
            {
                "TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, '
                '"task": {"type": "worker", "index": "' + "1" * 4301 + '"}}'
            },
            ["task.index", "not an integer"],
        ),
    ],
)
def test_huge_slurm_lists_are_refused_before_expanding(env, words):
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ConfigError) as info:
            resolve_cluster(env)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20 and time.perf_counter() - started < 1.0  # bytes, seconds
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
    for word in words:
        assert word in str(info.value)


def test_expansion_bounds_are_exact():
    assert len(expand_hostlist("n[00001-65536]")) == MAX_SLURM_TASKS
    with pytest.raises(ConfigError, match=r"names 65537 nodes, more than mirrorfit's cap"):
        expand_hostlist("n[1-65536],m1")
    assert expand_hostlist("n[1-2],m1", max_hosts=3) == ["n1", "n2", "m1"]
    assert expand_tasks_per_node("2(x3)", max_nodes=3) == [2, 2, 2]
    with pytest.raises(ConfigError, match="names 4 nodes, more than 3"):
        expand_tasks_per_node("2(x3),1", max_nodes=3)
    c = resolve_cluster(slurm(3, ntasks=4, nodes="n[1-4]", per_node="1(x4)"))
    assert c.workers[-1] == "n4:8888"


def test_cluster_checks_its_fields():
    with pytest.raises(ConfigError, match="source 'k8s'"):
        Cluster(workers=("a:1",), source="k8s")
    c = Cluster(workers=["a:1", "b:2"], task_index=1, source="launch")  # lists become tuples
    assert c.workers == ("a:1", "b:2") and hash(c)


# -- against TensorFlow's own resolvers (imports TensorFlow once: ~6 s) ---------------------


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def test_tf_resolver(tf):
    jobs = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1"]}
    r = resolve_cluster(tf_config(jobs, "worker", 1)).tf_resolver()
    assert r.cluster_spec().as_dict() == jobs
    assert (r.task_type, r.task_id, r.rpc_layer) == ("worker", 1, "grpc")


@pytest.mark.parametrize(
    "nodes, per_node, ntasks",
    [("gn[10-11]", "2(x2)", 4), ("b1,a1", "2,1", 3), ("n[08-10],m1", "1(x4)", 4)],
)
def test_slurm_layout_matches_slurm_cluster_resolver(tf, monkeypatch, nodes, per_node, ntasks):
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as tf_slurm

    assert expand_hostlist(nodes) == tf_slurm.expand_hostlist(nodes)
    assert expand_tasks_per_node(per_node) == tf_slurm.expand_tasks_per_node(per_node)
    for rank in range(ntasks):
        env = slurm(rank, ntasks=ntasks, nodes=nodes, per_node=per_node)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        # TF places at most gpus_per_node / gpus_per_task tasks on a node: one "GPU" each
        theirs = tf_slurm.SlurmClusterResolver(
            gpus_per_node=max(expand_tasks_per_node(per_node)), gpus_per_task=1, auto_set_gpu=False
        )
        spec = theirs.cluster_spec().as_dict()
        ours = resolve_cluster(env)
        assert list(ours.workers) == spec["worker"]
        assert (ours.task_type, ours.task_index) == theirs.get_task_info()


def test_a_one_process_strategy_inside_a_described_cluster_is_refused():
    import json as _json

    from mirrorfit.distribute.cluster import cluster_for
    from mirrorfit.errors import ConfigError

    env = {
        "TF_CONFIG": _json.dumps(
            {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}
        )
    }
    # Under `mirrorfit launch` without --strategy multi-worker, each task would train alone and
    # write the same outputs.
    with pytest.raises(
        ConfigError, match="--strategy auto trains alone; pass --strategy multi-worker"
    ):
        cluster_for("auto", env)
    assert cluster_for("multi-worker", env).num_workers == 2
    assert cluster_for("mirrored", {}) is None


def test_non_ascii_digits_in_an_index_are_one_line_not_a_traceback():
    import json as _json

    from mirrorfit.distribute.cluster import resolve_cluster
    from mirrorfit.errors import ConfigError

    with pytest.raises(ConfigError):
        resolve_cluster(
            {
                "TF_CONFIG": _json.dumps(
                    {
                        "cluster": {"worker": ["a:1", "b:2"]},
                        "task": {"type": "worker", "index": "²"},
                    }
                )
            }
        )


@pytest.mark.parametrize(
    "workers, index, ip, note",
    [
        (("127.0.0.1:2222", "127.0.0.1:2223"), 0, "127.0.0.1", None),
        (("localhost:2222", "localhost:2223"), 1, "127.0.0.1", None),
        # Not this host's address (NAT, a container's published port): every interface, said so
        (("192.0.2.7:2222", "192.0.2.8:2222"), 0, None, "192.0.2.7 is not an address of this host"),
        # A name for loopback while the other task is elsewhere (Debian's 127.0.1.1): the other
        # host could not reach a server on it
        (("127.0.1.1:2222", "192.0.2.8:2222"), 0, None, "a loopback address, but other tasks"),
        (("0.0.0.0:2222", "127.0.0.1:2223"), 0, None, "asks for every interface"),
    ],
)
def test_a_task_listens_on_its_own_address_when_it_can(workers, index, ip, note):
    from mirrorfit.distribute._listen import listen_host

    got_ip, got_note = listen_host(Cluster(workers=workers, task_index=index))
    assert got_ip == ip
    assert (got_note is None) if note is None else (note in got_note), got_note
