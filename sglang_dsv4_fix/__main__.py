from __future__ import annotations

from sglang_dsv4_fix.main import main

raise SystemExit(main())
