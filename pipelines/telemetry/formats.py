"""The telemetry topics of every template and their payloads read in each template's format, as columns.

``payload.topic_template`` and the ``payload.formats`` entries read into the declared fields are the
telemetry templates (:attr:`.config.PayloadConfig.templates`). A row's template is the first its topic
matches; its placeholders (the device id, the tags) come from that template, and its payload is read in
that template's format: JSON by Spark's own ``from_json``, CBOR and Protobuf by their readers on the
executors (:func:`pipelines.payloads.spark_fields.decoded_struct`). Every format gives the same struct: the
declared fields, :data:`ERROR` (whether the payload could not be read) and :data:`DETAIL` (where it broke:
the field or the byte offset). ``from_json`` does not say where; :func:`json_detail` reads the payloads it
refused again with the Python JSON reader, for the quarantined rows only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from pyspark.sql import Column
from pyspark.sql import functions as F

from pipelines.payloads.fields import FLOAT_MAX
from pipelines.payloads.formats import FieldFormat
from pipelines.payloads.spark_fields import decoded_struct
from pipelines.timestamps import FIRST_SECOND, LAST_SECOND, first_tick, last_tick

from .config import PayloadConfig, TopicTemplate

#: The struct fields :func:`decoded_payload` adds to the declared ones.
ERROR = "_error"
DETAIL = "_detail"
_CORRUPT = "_corrupt_record"
#: The field types a JSON payload gives as text (ISO-8601), read by :func:`time_readings`.
_TIME_TYPES = ("timestamp", "date")
#: How a JSON payload's field of each type is read before its own checks: time fields as their text, a
#: float as a double and a tinyint as an int, whose ranges are checked (:data:`_NARROWED`).
_JSON_READ_AS = {"timestamp": "string", "date": "string", "float": "double", "tinyint": "int", "byte": "int"}
#: JSON only: Jackson's default takes 'single-quoted' names and strings. Strings of any length: Jackson's
#: default refuses one past 20,000,000 characters, a valid payload (the broker's packet limit bounds them).
_JSON_ONLY = {"allowSingleQuotes": "false", "maxStringLen": str(2**31 - 1)}
#: The detail of a JSON payload the Python reader reads though ``from_json`` did not.
JSON_REFUSED = "json: not an object of the declared fields and types"


def matches(template: TopicTemplate) -> Column:
    return F.col("topic").rlike(template.regex)


def is_telemetry(payload: PayloadConfig) -> Column:
    """Whether the row's topic is one of a telemetry template's."""
    templates = [matches(template) for template, _ in payload.templates]
    result = templates[0]
    for condition in templates[1:]:
        result = result | condition
    return result


def _by_template(payload: PayloadConfig, value: dict[str, Column]) -> Column:
    """``value[template]`` of the row's template (null when none matches)."""
    templates = [template for template, _ in payload.templates]
    result = F.when(matches(templates[0]), value[templates[0].template])
    for template in templates[1:]:
        result = result.when(matches(template), value[template.template])
    return result


def placeholder(template: TopicTemplate, name: str) -> Column:
    return F.regexp_extract(F.col("topic"), template.regex, template.placeholders.index(name) + 1)


def device_id(payload: PayloadConfig) -> Column:
    return _by_template(payload, {t.template: placeholder(t, "device_id") for t, _ in payload.templates})


def tags(template: TopicTemplate) -> Column:
    """Placeholders other than the device id (``sites/{site}/...``) as a string map, for ``devices.tags``."""
    others = [name for name in template.placeholders if name != "device_id"]
    if not others:
        return F.create_map().cast("map<string,string>")
    return F.create_map(*[item for name in others for item in (F.lit(name), placeholder(template, name))])


def topic_tags(payload: PayloadConfig) -> Column:
    return _by_template(payload, {t.template: tags(t) for t, _ in payload.templates})


def payload_readings(payload: PayloadConfig) -> list[Column]:
    """Each template's payloads read in its format (null on the other rows), one column per template: a
    projection of their own before :func:`decoded_payload`'s. Spark evaluates an expression once per row
    only where it is not inside a branch of a ``CASE WHEN``; built into the struct, the reader would run
    once for each of its fields."""
    fields = {name: type_name.strip().lower() for name, type_name in payload.fields.items()}
    readings = []
    for number, (template, reader) in enumerate(payload.templates):
        readings.append(_read(template, reader, fields).alias(_reading(number)))
        if reader.name == "json":  # a column of its own too: added to the struct, from_json would run again
            text = F.col("payload").cast("string")
            readings.append(F.when(matches(template), _more_after_the_object(text)).alias(_trailing(number)))
    return readings


def decoded_payload(payload: PayloadConfig) -> Column:
    """The row's payload read in its template's format (from :func:`payload_readings`' columns): a struct
    of the declared fields, :data:`ERROR` and :data:`DETAIL` (null on rows of no template)."""
    structs = {
        t.template: _decoded(payload, f, F.col(_reading(number)), number)
        for number, (t, f) in enumerate(payload.templates)
    }
    return _by_template(payload, structs)


def time_readings(payload: PayloadConfig) -> list[Column]:
    """The ``timestamp`` and ``date`` fields of each JSON template's payloads, read from their text in
    :func:`payload_readings`' columns (a projection after theirs, before :func:`decoded_payload`'s).

    Spark's JSON parser reads a number in such a field as epoch seconds (overflowing silently: a clock
    counting nanoseconds wraps to any date), so the reading takes each as text, and this reads the text
    as ``from_json`` reads a time string: a number, an object or text that is no time gives null."""
    types = _time_fields(payload)
    if not types:
        return []
    schema = ", ".join(f"`{name}` {kind}" for name, kind in types.items())
    columns = []
    for number, (_, reader) in enumerate(payload.templates):
        if reader.name == "json":
            raw = F.col(_reading(number))
            texts = F.to_json(F.struct(*[raw.getField(name).alias(name) for name in types]))
            columns.append(
                F.when(raw.isNotNull(), F.from_json(texts, schema, _JSON_ONLY)).alias(_times(number))
            )
    return columns


def _time_fields(payload: PayloadConfig) -> dict[str, str]:
    fields = {name: kind.strip().lower() for name, kind in payload.fields.items()}
    return {name: kind for name, kind in fields.items() if kind in _TIME_TYPES}


def _reading(number: int) -> str:
    return f"_reading_{number}"


def _times(number: int) -> str:
    """The column of a JSON template's time fields (:func:`time_readings`)."""
    return f"_times_{number}"


def _trailing(number: int) -> str:
    """The column saying whether a JSON template's payload holds more than its object."""
    return f"_trailing_{number}"


def _read(template: TopicTemplate, reader: FieldFormat, fields: dict[str, str]) -> Column:
    """The template's payloads (only its rows') read: ``from_json``'s struct with :data:`_CORRUPT` for
    JSON, :func:`decoded_struct`'s with :data:`DETAIL` for the others."""
    if reader.name == "json":  # time fields as their text (read by time_readings), floats as doubles
        schema = ", ".join(f"`{name}` {_JSON_READ_AS.get(kind, kind)}" for name, kind in fields.items())
        return F.when(
            matches(template),
            F.from_json(
                F.col("payload").cast("string"),
                f"{schema}, `{_CORRUPT}` string",
                {"columnNameOfCorruptRecord": _CORRUPT, **_JSON_ONLY},
            ),
        )
    # only the template's rows reach the reader: the others are null payloads, skipped at once
    return decoded_struct(F.when(matches(template), F.col("payload")), reader, fields, DETAIL)


def _more_after_the_object(text: Column) -> Column:
    """Whether JSON ``text`` holds more than whitespace after its first value, which ``from_json`` ignores
    (``{...}{...}``: a second reading that would be lost). Only a payload with more than whitespace after
    its first ``}`` may (a flat object has nothing there), and only such a payload is parsed again, inside
    brackets and as an object's value: what follows the object then breaks one of the two (or, after a
    comma, makes a list of more than one value)."""
    listed = F.from_json(F.concat(F.lit("["), text, F.lit("]")), "array<string>", _JSON_ONLY)
    held = F.from_json(F.concat(F.lit('{"v":'), text, F.lit("}")), "map<string,string>", _JSON_ONLY)
    breaks = F.coalesce(F.size(listed) != 1, F.lit(True)) | (text.contains("]") & held.isNull())
    return F.when(text.rlike(r"^[^}]*\}\s*\S"), breaks).otherwise(F.lit(False))


def _decoded(payload: PayloadConfig, reader: FieldFormat, parsed: Column, number: int) -> Column:
    fields = [name for name in payload.fields]
    values = {name: parsed.getField(name) for name in fields}
    if reader.name == "json":
        # the payload's bytes cast to a string keep bytes that are no UTF-8, which the parser would read as
        # U+FFFD inside a string value: such a payload is refused as the Python reader refuses it
        utf8 = F.is_valid_utf8(F.col("payload").cast("string"))
        error = parsed.isNull() | parsed.getField(_CORRUPT).isNotNull() | F.col(_trailing(number)) | ~utf8
        text = F.col("payload").cast("string")
        error = error | _declared_twice(text, fields) | _other_kind(text, payload.fields)
        for name, kind in _time_fields(payload).items():
            values[name] = F.col(_times(number)).getField(name)
            error = error | (parsed.getField(name).isNotNull() & ~_a_time(values[name], kind))
        for name, kind in payload.fields.items():
            # read wider and checked: Spark's parser turns a number the type cannot hold into another
            narrower = _NARROWED.get(kind.strip().lower())
            if narrower is not None:
                values[name] = parsed.getField(name).cast(kind.strip().lower())
                error = error | narrower(parsed.getField(name))
        detail = F.lit(None).cast("string")
    else:
        detail = parsed.getField(DETAIL)
        error = detail.isNotNull()
    return F.struct(
        *[F.when(~error, values[name]).alias(name) for name in fields],  # none from a bad payload
        error.alias(ERROR),
        detail.alias(DETAIL),
    )


def _declared_twice(text: Column, fields: list[str]) -> Column:
    """Whether the JSON object ``text`` gives a declared field's name twice, of which ``from_json`` keeps the
    last value. Only a payload holding one of the names twice as ``"name":`` may (one regular expression),
    and only such a payload's top-level names are listed (``json_object_keys``) and counted."""
    if not fields:
        return F.lit(False)
    names = "|".join(re.escape(name) for name in fields)
    candidate = text.rlike(f'(?s)"({names})"\\s*:.*"\\1"\\s*:')
    keys = F.json_object_keys(text)
    declared = F.array(*[F.lit(name) for name in fields])
    twice = F.exists(declared, lambda name: F.size(F.filter(keys, lambda key: key == name)) > 1)
    return F.when(candidate, F.coalesce(twice, F.lit(False))).otherwise(F.lit(False))


def _other_kind(text: Column, fields: Mapping[str, str]) -> Column:
    """Whether the JSON object ``text`` gives a string field a value that is no string (a number, an object,
    a list, a boolean), which ``from_json`` would take as its JSON text, or a floating point field a string
    (``"NaN"``, ``"Infinity"``), which it would take as that number."""
    kinds = {name: kind.strip().lower() for name, kind in fields.items()}
    strings = [name for name, kind in kinds.items() if kind == "string"]
    floats = [name for name, kind in kinds.items() if kind in ("double", "float")]
    return _top_level_kind(text, strings, '[^"\\sn]', lambda kind: ~kind.isin("STRING", "VOID")) | (
        _top_level_kind(text, floats, '"', lambda kind: kind == "STRING")
    )


def _top_level_kind(
    text: Column, names: list[str], follows: str, wrong: Callable[[Column], Column]
) -> Column:
    """Whether one of the top-level values ``names`` of the JSON object ``text`` is of a ``wrong`` kind (a
    variant's type name: STRING, BIGINT, OBJECT<...>, VOID for null). Only a payload where such a name is
    followed by what the regular expression ``follows`` matches may be, and only such a payload is parsed
    again, as a variant whose values' types are read."""
    if not names:
        return F.lit(False)
    pattern = "|".join(re.escape(name) for name in names)
    candidate = text.rlike(f'"({pattern})"\\s*:\\s*{follows}')
    document = F.try_parse_json(text)
    found = F.lit(False)
    for name in names:
        kind = F.schema_of_variant(F.variant_get(document, _variant_path(name), "variant"))
        found = found | F.coalesce(wrong(kind), F.lit(False))
    return F.when(candidate, found).otherwise(F.lit(False))


def json_string(text: Column, name: str) -> Column:
    """The string the JSON object ``text`` gives its top-level field ``name``; null when that is anything
    else (a number, an object, a list), missing, or ``text`` is no JSON (``get_json_object`` would give a
    number or an object as its JSON text)."""
    value = F.variant_get(F.try_parse_json(text), _variant_path(name), "variant")
    return F.when(F.schema_of_variant(value) == "STRING", F.variant_get(value, "$", "string"))


def _variant_path(name: str) -> str:
    """The variant path of a top-level field (``$['name']``, quotes escaped)."""
    return "$['" + name.replace("\\", "\\\\").replace("'", "\\'") + "']"


def _past_floats(value: Column) -> Column:
    """Whether a JSON number read as a double is finite but past a float's range, which Spark's parser
    would have made Infinity (Infinity and NaN as such, and numbers past any double, stay what they are)."""
    magnitude = F.abs(value)
    wide = (magnitude > F.lit(FLOAT_MAX)) & (magnitude != F.lit(float("inf"))) & ~F.isnan(value)
    return F.coalesce(wide, F.lit(False))


def _past_bytes(value: Column) -> Column:
    """Whether a JSON integer read as an int is past a tinyint's range (Spark's parser would have taken
    128 to 255 as a byte's bits: 200 as -56)."""
    return F.coalesce(~value.between(-128, 127), F.lit(False))


#: The field types a JSON payload's value is read wider for, and the check that it fits.
_NARROWED = {"float": _past_floats, "tinyint": _past_bytes, "byte": _past_bytes}


def _a_time(value: Column, kind: str) -> Column:
    """Whether ``value`` (a timestamp or a date, null for text that is no time) is in the years 0001 to
    9999, which Python readers of the tables hold (Spark's go further)."""
    if kind == "date":
        days = F.unix_date(value)
        return F.coalesce(days.between(FIRST_SECOND // 86_400, LAST_SECOND // 86_400), F.lit(False))
    micros = F.unix_micros(value)
    return F.coalesce(micros.between(first_tick(1_000_000), last_tick(1_000_000)), F.lit(False))


def json_detail(payload: PayloadConfig, refused: Column) -> Column:
    """Where the JSON payloads ``from_json`` refused (``refused`` true) break, read again by the Python
    JSON reader; :data:`JSON_REFUSED` when it reads them. Null on the other rows."""
    fields = {name: type_name.strip().lower() for name, type_name in payload.fields.items()}
    again = decoded_struct(F.when(refused, F.col("payload")), FieldFormat("json"), fields, DETAIL)
    return F.when(refused, F.coalesce(again.getField(DETAIL), F.lit(JSON_REFUSED)))
