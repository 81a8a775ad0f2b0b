"""Names, keys, the strict base every boundary model shares, and how a record another release wrote is read."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from orchestrator.errors import IncompatibleRecordError, validation_problems


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the manifest uses."""
    return datetime.now(timezone.utc)


# The name rule, its one home: the pattern a Name must match, and what makes any text one.
_NAME_CHARS = "A-Za-z0-9._=-"
NAME_PATTERN = rf"^[A-Za-z0-9][{_NAME_CHARS}]*$"
NAME_MAX_LENGTH = 128
_NOT_NAME_CHAR = re.compile(rf"[^{_NAME_CHARS}]")
_KEY_MAX_LENGTH = 1024
# C0 controls, DEL and C1 controls: never part of a name, a key or a path.
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _check_name(value: str) -> str:
    # Names become storage path components: refuse anything that could climb out.
    if ".." in value:
        raise ValueError("must not contain '..'")
    return value


def _check_key(value: str) -> str:
    # Keys are joined onto a storage root and onto a download folder: a relative
    # path of plain parts, nothing that climbs out or reaches the terminal.
    if value.startswith("/") or "\\" in value:
        raise ValueError("must be a relative path with '/' separators")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise ValueError("must not have empty, '.' or '..' parts")
    if _CONTROL_CHARS.search(value):
        raise ValueError("must not contain control characters")
    return value


def to_name(text: str) -> str:
    """``text`` made a valid :data:`Name`: other characters and '..' become '_', a leading
    non-alphanumeric gets ``run`` before it, and the result is cut to the maximum length."""
    name = _NOT_NAME_CHAR.sub("_", text).replace("..", "_")
    if not name or not name[0].isalnum():
        name = "run" + name
    return name[:NAME_MAX_LENGTH]


Name = Annotated[
    str,
    Field(min_length=1, max_length=NAME_MAX_LENGTH, pattern=NAME_PATTERN),
    AfterValidator(_check_name),
]
"""A target or profile id: letters, digits, '.', '_', '-', '='; no separators, no '..'."""

# Printable ASCII, no spaces: what an HTTP header carries unchanged.
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]+$"
IDEMPOTENCY_KEY_MAX_LENGTH = 255

IdempotencyKey = Annotated[
    str, Field(min_length=1, max_length=IDEMPOTENCY_KEY_MAX_LENGTH, pattern=IDEMPOTENCY_KEY_PATTERN)
]
"""A client's name for one submit (the ``Idempotency-Key`` header): a retry with it returns the first profile."""

ArtifactKey = Annotated[str, Field(min_length=1, max_length=_KEY_MAX_LENGTH), AfterValidator(_check_key)]
"""A storage key relative to a root or a profile folder: no absolute path, no '..', no control characters."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __setstate__(self, state: dict[Any, Any]) -> None:
        """Unpickled (a record crossing processes through Ray) as another rayprof build pickled it: an agent that
        started before its controller was replaced by an upgrade's. Fields that build did not have take their
        defaults, where a later one reads them; one without a default makes the record unreadable, said so.
        Fields only it had are never read here."""
        super().__setstate__(state)
        fields = type(self).model_fields
        if fields.keys() <= self.__dict__.keys():
            return  # the same build, or a later one: every field is there
        missing = [name for name in fields if name not in self.__dict__]
        required = [name for name in missing if fields[name].is_required()]
        if required:
            raise IncompatibleRecordError(
                f"a {type(self).__name__} from another rayprof build lacks {', '.join(required)}: restart the process "
                "that sent it (a training job started before rayprof was upgraded) so it runs this build"
            )
        for name in missing:
            self.__dict__[name] = fields[name].get_default(call_default_factory=True, validated_data=self.__dict__)


RecordT = TypeVar("RecordT")
_PROBLEMS_SHOWN = 3


def read_lenient(kind: type[RecordT] | TypeAdapter[RecordT], data: Any, *, source: str) -> RecordT:
    """``data`` (parsed JSON, or its bytes or text) as ``kind``, where another process wrote it and this one only
    reads it: the service's answers to a client, a manifest in storage or in a downloaded folder.

    Fields this release does not know are left out, so a client may run an older rayprof than the service
    (a release adds fields; tests/unit/test_release_mix.py reads a summary the first day's code wrote). What this
    process acts on stays strict: requests, and the controller's own saved state, which it writes back.
    Anything else that does not fit raises :class:`IncompatibleRecordError` naming ``source``.
    """
    adapter = kind if isinstance(kind, TypeAdapter) else TypeAdapter(kind)
    try:
        if isinstance(data, str | bytes):
            return adapter.validate_json(data, extra="ignore")
        return adapter.validate_python(data, extra="ignore")
    except ValidationError as e:
        problems = e.errors()
        more = f" and {len(problems) - _PROBLEMS_SHOWN} more" if len(problems) > _PROBLEMS_SHOWN else ""
        raise IncompatibleRecordError(
            f"{source} cannot be read by this rayprof ({validation_problems(problems[:_PROBLEMS_SHOWN])}{more}): "
            "another rayprof release wrote it, or it is damaged; where a service wrote it, install the service's "
            "release here (docs/deploy.md)"
        ) from None
