"""Inference: one way to run a trained model (``trained``: ``open_model``, ``TrainedModel.predict``), and
below it whole-image, sliding-window and test-time-augmented prediction in torch (``infer``), the same
geometry in numpy around onnxruntime (``onnx``), streaming over rasters and image I/O. The window
geometry (``segattn.tiling``) and the raster reads and writes (``segattn.raster_io``) sit below, shared
with data/.

Import what you use from its module (``from segattn.inference.infer import infer``): the package imports
nothing itself, so the onnxruntime path runs where torch is not installed.
"""
