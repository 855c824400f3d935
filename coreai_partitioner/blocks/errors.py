"""What a family's adapter refuses: a config value it cannot honour."""

from __future__ import annotations


class UnsupportedConfig(ValueError):
    """A config value a family's adapter cannot honour; names the field and what it takes."""

    def __init__(self, field: str, value: object, takes: str, model_type: str | None = None) -> None:
        where = f"{model_type}: " if model_type else ""
        super().__init__(f"{where}config.{field} = {value!r} is not supported; it takes {takes}")
        self.field = field
