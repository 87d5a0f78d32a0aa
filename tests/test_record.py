"""@record: the same class as @dataclass(frozen=True, slots=True), with a faster constructor."""

import dataclasses
import pickle

import pytest

from kvsim.record import record


@record
class Point:
    x_tokens: int
    y_s: float = 0.5
    tag: tuple = dataclasses.field(default=(), compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Reference:
    x_tokens: int
    y_s: float = 0.5
    tag: tuple = dataclasses.field(default=(), compare=False)


def test_behaves_like_a_frozen_slotted_dataclass():
    p = Point(3)
    assert (p.x_tokens, p.y_s, p.tag) == (3, 0.5, ())
    assert Point(3, y_s=1.5, tag=(1,)) == Point(3, 1.5)  # tag excluded from comparison
    assert Point(3) != Point(4)
    assert hash(Point(3, 2.0)) == hash(Point(3, 2.0))
    assert repr(Point(3)) == repr(Reference(3)).replace("Reference", "Point")
    assert dataclasses.replace(p, y_s=2.0) == Point(3, 2.0)
    assert pickle.loads(pickle.dumps(Point(7, 1.0, (2,)))).tag == (2,)
    assert not hasattr(p, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x_tokens = 4
    with pytest.raises(TypeError):
        Point()  # a field without default is required
    with pytest.raises(TypeError):
        Point(1, 2.0, (), 4)


def test_refuses_fields_it_cannot_build():
    with pytest.raises(TypeError, match="only plain fields"):
        @record
        class Bad:
            xs: list = dataclasses.field(default_factory=list)
    with pytest.raises(TypeError, match="__post_init__"):
        @record
        class Bad2:
            x: int

            def __post_init__(self):
                pass
