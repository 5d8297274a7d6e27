"""Everything checkpoint but Lightning's own writing (``training.checkpointing``): atomic ``torch.save``,
resume and ``init_from``, and the safe loading of trained or exported models (``weights_only=True``,
safetensors, registry names only)."""
