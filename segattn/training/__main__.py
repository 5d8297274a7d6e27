"""``python -m segattn.training``: train.py without the checkout (what ``segattn-train`` runs)."""

from ..cli import train

train()
