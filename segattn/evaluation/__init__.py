"""Evaluation: the segmentation metrics (shared with training's validation and test) and the eval.py
command (``command.run``) that scores a trained or exported model on a dataset split."""
