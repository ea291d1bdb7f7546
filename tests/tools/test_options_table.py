"""docs/options.md's table of every field is the field registry's: a field added to
schema/fields.py without regenerating the doc fails here."""

import dataclasses

from wide_tf.schema import fields
from wide_tf.tools import options_table


def test_the_doc_lists_every_field_as_the_registry_has_it():
    text = options_table.DOC.read_text()
    assert options_table.render(text) == text, (
        "docs/options.md is out of date: run python -m wide_tf.tools.options_table"
    )
    missing = [p for p in fields.FIELDS if f"`{p}`" not in text]
    assert missing == []


def test_a_field_missing_from_the_doc_is_caught(monkeypatch):
    text = options_table.DOC.read_text()
    extra = dataclasses.replace(fields.FIELDS["train.seed"], path="train.some_new_field")
    monkeypatch.setitem(fields.FIELDS, "train.some_new_field", extra)
    assert options_table.render(text) != text
    assert "`train.some_new_field`" in options_table.table()
