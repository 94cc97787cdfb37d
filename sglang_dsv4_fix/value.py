"""Small value types that cost nothing to define.

The runtime plugin imports the domain's value types (tree, kernel record, verdict, …) in every
SGLang process, inside its start-up budget of 3 ms. Generating their methods is what cost most of
it: a dataclass ``exec``s its ``__init__``/``__eq__``/``__repr__`` (~1 ms each on the CI-class
machine), and ``typing.NamedTuple`` compiles a ForwardRef for every annotated field and ``eval``s
its ``__new__`` (1.8 ms for the nine types the plugin needs; plain classes: 0.13 ms; docs/plugin.md,
"Cost"). So a value type lists its fields in ``__slots__`` and writes its own typed ``__init__``;
comparison, ``repr``, ``_replace`` and ``_asdict`` come from :class:`Value`. Values are treated as
immutable: change one with ``_replace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a TypeVar bound by name compiles a ForwardRef at import: ~0.1 ms per process
    from typing import TypeVar

    V = TypeVar("V", bound="Value")


class Value:
    __slots__: tuple[str, ...] = ()

    def _asdict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def _replace(self: V, **changes: Any) -> V:
        unknown = set(changes) - set(self.__slots__)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        new = object.__new__(type(self))
        for name in self.__slots__:
            setattr(new, name, changes.get(name, getattr(self, name)))
        return new

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Value)
        return self._asdict() == other._asdict()

    def __hash__(self) -> int:
        return hash((type(self), *self._asdict().values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._asdict().items())
        return f"{type(self).__name__}({fields})"
