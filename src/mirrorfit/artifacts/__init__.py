"""What a run leaves on disk and what reads it back: step-exact checkpoints (``checkpoint``,
``checkpoint_meta``), versioned SavedModel exports (``export``, ``version_names``),
``mirrorfit evaluate`` (``evaluate``), and the checks of where a run writes (``output_paths``,
plain Python, before any backend loads)."""
