"""Errors the embedded target raises when a program or a request cannot be honoured."""

import grpc


class ProgramError(ValueError):
    """The bmv2 JSON (or P4Info) is malformed or uses a construct this target does not run."""


class UnsupportedConstruct(ProgramError):
    """A construct of the bmv2 JSON format that this target does not implement."""

    def __init__(self, construct: str, where: str) -> None:
        super().__init__(f"unsupported construct {construct!r} in {where}")
        self.construct = construct
        self.where = where


class P4RuntimeError(Exception):
    """A P4Runtime request error carrying its gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
