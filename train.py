"""Train a segmentation model: ``python train.py [group=option ...] [key=value ...]``; see conf/train.yaml."""

import hydra
from omegaconf import DictConfig

from segattn.config import register_resolvers
from segattn.training.run import run

register_resolvers()


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Train, print where the outputs went and the final metrics; the best mIoU is returned for sweeps."""
    return run(cfg)["best_mIoU"]


if __name__ == "__main__":
    main()
