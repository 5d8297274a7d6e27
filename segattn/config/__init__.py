"""Config plumbing for every command: where ``conf/`` is, its resolvers and config nodes as plain values
(``resolvers``), and the checks a composed config must pass before anything starts, each command's value
schema among them (``checks``)."""

from ..files import config_dir
from .checks import (
    EXPORT_FORMATS,
    SCHEMAS,
    NothingToDo,
    check_data_root,
    check_kernel,
    check_renamed,
    check_run_name,
    check_values,
    check_writable_dir,
)
from .resolvers import available_cores, plain, register_resolvers, workers

__all__ = [
    "EXPORT_FORMATS",
    "SCHEMAS",
    "NothingToDo",
    "available_cores",
    "check_data_root",
    "check_kernel",
    "check_renamed",
    "check_run_name",
    "check_values",
    "check_writable_dir",
    "config_dir",
    "plain",
    "register_resolvers",
    "workers",
]
