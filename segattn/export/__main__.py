"""``python -m segattn.export``."""

from .command import main

raise SystemExit(main())
