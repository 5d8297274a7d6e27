"""Training: the only package that knows Lightning. ``run(cfg)`` (in ``run.py``) is what train.py calls;
the LightningModule, losses, optimizers, callbacks, the pre-training checks and the run summary live here."""
