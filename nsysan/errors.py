"""The error hierarchy. Every user-facing failure is one of these; the CLI prints
``Error: <message>`` and exits 1, never a traceback. Messages say what went wrong, where,
and how to fix it."""

from __future__ import annotations


class NsysanError(Exception):
    """Base class of every error nsysan reports to a user."""


class ExportError(NsysanError):
    """`nsys` is missing, too old for the report, or its export failed."""


class TraceFormatError(NsysanError):
    """The input is not a usable profile (missing, empty, corrupt, not an nsys export)."""


class SchemaError(NsysanError):
    """The export lacks a table or column that the requested analysis needs."""


class ConfigError(NsysanError):
    """A parameter, pass name, budget file or other user setting is invalid."""


class OutputError(NsysanError):
    """An output location cannot be used: it holds files nsysan did not write, it is (or
    contains, or lies inside) an input, or the file system refused the write (permissions,
    read-only, full). Nothing was changed there."""
