"""Find, fix, verify and report the DeepSeek-V4 prefill-planner race in SGLang trees."""

from __future__ import annotations

__version__ = "0.1.0"
