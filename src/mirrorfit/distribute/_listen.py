"""Where a task's TensorFlow server listens, and whether its port is free.

- :func:`own_address`: while the server starts, a ``bind`` wrapper turns the wildcard
  address of this task's port into the task's own address (Linux ELF64, x86-64 and aarch64;
  elsewhere the server listens on every interface and the task says so);
- :func:`check_port`: this task's own port is taken, said at once.

Pure Python until a server starts. (why: docs/architecture.md#where-a-tensorflow-server-listens)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import os
import socket
import struct
import sys
from typing import Iterator

from mirrorfit.errors import ConfigError

_JUMP_SLOT = {62: 7, 183: 1026}  # e_machine (x86-64, aarch64) -> R_*_JUMP_SLOT
_GLOB_DAT = {62: 6, 183: 1025}
_BIND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _is_loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip).is_loopback


def _resolve(host: str) -> str | None:
    """An IP for ``host`` (IPv4 first), None if it does not resolve."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return infos[0][4][0] if infos else None


def listen_host(cluster) -> tuple[str | None, str | None]:
    """(the IP this task's server should listen on, None for every interface; a note saying
    why it listens on every interface, or None)."""
    me = cluster.address(cluster.task_type, cluster.task_index)
    host, _ = _split(me)
    ip = _resolve(host)
    if ip is None:
        return None, f"{me}: {host} does not resolve here"
    if ipaddress.ip_address(ip).is_unspecified:
        return None, f"{me} asks for every interface"
    if _is_loopback(ip) and any(not _is_loopback(o) for o in _peer_ips(cluster, me)):
        # e.g. Debian's /etc/hosts maps the host's own name to 127.0.1.1: the other hosts
        # could not reach a server on it
        return (
            None,
            f"{me}: {host} is {ip} here, a loopback address, but other tasks are on other hosts",
        )
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError:  # not this host's address (NAT, a container's published port)
            return None, f"{me}: {ip} is not an address of this host"
    return ip, None


def _peer_ips(cluster, me: str):
    """The other tasks' IPs, resolved one by one as asked (a name may take DNS seconds)."""
    for address in (*([cluster.chief] if cluster.chief else []), *cluster.workers, *cluster.ps):
        if address != me:
            ip = _resolve(_split(address)[0])
            if ip is not None:
                yield ip


def check_port(cluster, ip: str | None) -> None:
    """ConfigError (one line) if this task's port cannot be bound on ``ip`` (None: every
    interface) now: another process listens on it, or it needs privileges."""
    me = cluster.address(cluster.task_type, cluster.task_index)
    _, port = _split(me)
    family = socket.AF_INET6 if ip and ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As gRPC binds: SO_REUSEADDR, so a port in TIME_WAIT is free, one listened on is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip or "", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                why = "is in use by another process on this host"
            elif e.errno == errno.EACCES:
                why = "needs privileges (ports below 1024)"
            else:
                why = f"cannot be bound ({e.strerror})"
            raise ConfigError(
                f"{cluster.task_name()}: this task's port {port} ({me} in "
                f"{cluster.source}) {why}; free it, or give this task another "
                "port (mirrorfit launch picks free ones)"
            ) from None


def prepare(cluster) -> tuple[str | None, str | None]:
    """:func:`listen_host`, then :func:`check_port` on it; (ip, note) as listen_host."""
    ip, note = listen_host(cluster)
    check_port(cluster, ip)
    return ip, note


@contextlib.contextmanager
def own_address(ip: str | None, port: int) -> Iterator[bool]:
    """While the block starts this task's server: its wildcard bind of ``port`` listens on
    ``ip`` instead. Yields whether the rewrite is in place (False: ``ip`` None, or not
    possible here: the server listens on every interface)."""
    slots = _slots() if ip else []
    if not slots:
        yield False
        return
    libc = ctypes.CDLL(None, use_errno=True)
    real = _BIND(ctypes.cast(libc.bind, ctypes.c_void_p).value)
    v4 = ":" not in ip
    packed = socket.inet_pton(socket.AF_INET if v4 else socket.AF_INET6, ip)

    def bind(fd, addr, length):
        raw = ctypes.string_at(addr, length)
        family = struct.unpack_from("=H", raw)[0]
        if len(raw) >= 8 and struct.unpack_from(">H", raw, 2)[0] == port:
            if family == socket.AF_INET and raw[4:8] == bytes(4) and v4:
                new = raw[:4] + packed + raw[8:]
                return real(fd, ctypes.create_string_buffer(new, length), length)
            if family == socket.AF_INET6 and len(raw) >= 24 and raw[8:24] == bytes(16):
                # gRPC's wildcard is a dual-stack [::] socket: an IPv4 address as ::ffff:a.b.c.d
                address = (bytes(10) + b"\xff\xff" + packed) if v4 else packed
                new = raw[:8] + address + raw[24:]
                return real(fd, ctypes.create_string_buffer(new, length), length)
        return real(fd, addr, length)

    callback = _BIND(bind)
    pointer = ctypes.cast(callback, ctypes.c_void_p).value
    saved = [(slot, ctypes.c_void_p.from_address(slot).value) for slot in slots]
    try:
        for slot, _ in saved:
            ctypes.c_void_p.from_address(slot).value = pointer
        yield True
    finally:
        for slot, value in saved:
            ctypes.c_void_p.from_address(slot).value = value
        _keep.append(callback)  # a thread still inside it must not find it freed


_keep: list = []


def _slots() -> list[int]:
    """Addresses of the ``bind`` entries of TensorFlow's loaded libraries' relocation tables,
    made writable; [] where that cannot be done here."""
    if not sys.platform.startswith("linux") or struct.calcsize("P") != 8:
        return []
    try:
        with open("/proc/self/maps") as f:
            maps = [line.split() for line in f]
    except OSError:
        return []
    bases: dict[str, int] = {}
    for parts in maps:
        if len(parts) >= 6 and int(parts[2], 16) == 0:
            name = os.path.basename(parts[5])
            if name.startswith(("libtensorflow", "_pywrap_tensorflow")):
                start = int(parts[0].split("-")[0], 16)
                bases[parts[5]] = min(start, bases.get(parts[5], start))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = os.sysconf("SC_PAGE_SIZE")
    slots = []
    for path, base in bases.items():
        try:
            offsets = _bind_relocations(path)
        except (OSError, ValueError, struct.error, IndexError):
            continue
        for offset in offsets:
            slot = base + offset
            # read and write: a library linked with full RELRO has made its table read-only
            if libc.mprotect(slot & ~(page - 1), page, 3) == 0:
                slots.append(slot)
    return slots


def _bind_relocations(path: str) -> list[int]:
    """Offsets (from the load address) of the relocation slots of the symbol ``bind`` in the
    ELF64 little-endian shared library ``path``."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise ValueError("not ELF64 little-endian")
        machine = struct.unpack_from("<H", header, 18)[0]
        if machine not in _JUMP_SLOT:
            raise ValueError("unknown machine")
        shoff = struct.unpack_from("<Q", header, 0x28)[0]
        size, count, names_index = struct.unpack_from("<HHH", header, 0x3A)
        f.seek(shoff)
        table = f.read(size * count)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * size) for i in range(count)]

        def read(section) -> bytes:
            f.seek(section[4])
            return f.read(section[5])

        names = read(sections[names_index])
        by_name = {names[s[0] : names.index(b"\0", s[0])]: s for s in sections}
        symbols, strings = read(by_name[b".dynsym"]), read(by_name[b".dynstr"])
        found = []
        for kind in (b".rela.plt",):  # calls go through it (.rela.dyn: 10^5 entries, none)
            if kind not in by_name:
                continue
            rela = read(by_name[kind])
            for i in range(0, len(rela) - 23, 24):
                offset, info = struct.unpack_from("<QQ", rela, i)
                if info & 0xFFFFFFFF not in (_JUMP_SLOT[machine], _GLOB_DAT[machine]):
                    continue
                name_at = struct.unpack_from("<I", symbols, (info >> 32) * 24)[0]
                if strings[name_at : strings.index(b"\0", name_at)] == b"bind":
                    found.append(offset)
        return found


@contextlib.contextmanager
def listening(cluster):
    """While the block starts this task's TensorFlow server: it listens on the task's own
    address from the cluster spec (TF alone listens on every interface), and a port another
    process holds is one line at once (TF waited, then blamed a peer). Where it must listen on
    every interface, one line says so."""
    ip, note = prepare(cluster)
    port = int(cluster.address(cluster.task_type, cluster.task_index).rpartition(":")[2])
    with own_address(ip, port) as rewritten:
        yield
    if not rewritten:
        why = note or "this platform's TensorFlow libraries cannot be redirected"
        print(
            f"mirrorfit: {cluster.task_name()}: TensorFlow's server listens on every interface "
            f"({why}); keep the job on a private network",
            file=sys.stderr,
        )


__all__ = ["check_port", "listen_host", "listening", "own_address", "prepare"]
