"""Train a segmentation model: ``python train.py [group=option ...] [key=value ...]``; see conf/train.yaml
(``--help`` lists the groups and keys). The same command is installed as ``segattn-train``."""

from segattn.cli import train

if __name__ == "__main__":
    train()
