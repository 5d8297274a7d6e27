"""Evaluate a model: ``python eval.py checkpoint=<ckpt | exported dir | model.onnx> [split=test] ...``; see
conf/eval.yaml (``--help`` lists the groups and keys). The same command is installed as ``segattn-eval``."""

from segattn.cli import evaluate

if __name__ == "__main__":
    evaluate()
