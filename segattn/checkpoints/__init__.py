"""Everything checkpoint: atomic writes, ``last.ckpt`` after every epoch, resume and ``init_from``, and the
safe loading of trained or exported models (``weights_only=True``, safetensors, registry names only)."""
