"""Evaluate a model: ``python eval.py checkpoint=<ckpt | exported dir | model.onnx> [split=test] ...``;
see conf/eval.yaml."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from segattn.config import register_resolvers
from segattn.data.errors import DataError
from segattn.evaluation.command import run

register_resolvers()


@hydra.main(config_path="conf", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> float:
    """Score the model on one split; a bad input is one line on stderr and exit status 1."""
    try:
        return run(cfg)["summary"]["mIoU"]
    except (DataError, FileNotFoundError, ValueError) as error:
        run_dir = Path(cfg.paths.output_dir)
        if run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()  # Hydra made it before the checks ran; leave nothing behind
        print(f"eval.py: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
