"""Our protobuf messages are wire-compatible with Triton's: same field numbers, types and cardinality.

They live in another package (edgeinfer.v2) so both can be imported into one process; this test imports
both and compares every field of every message we define with tritonclient's descriptors.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import model_config_pb2, service_pb2

from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as ours
from edgeinfer.server.grpc import SERVICE_NAME

OURS = ours.DESCRIPTOR.message_types_by_name


def triton_message(name: str) -> Descriptor:
    for module in (service_pb2, model_config_pb2):
        found = module.DESCRIPTOR.message_types_by_name.get(name)
        if found is not None:
            return found
    raise LookupError(name)


def signature(field) -> tuple:
    kind = field.message_type.name if field.message_type else field.type
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value = field.message_type.fields_by_name["value"]
        kind = ("map", value.message_type.name if value.message_type else value.type)
    return (field.name, kind, field.is_repeated)


def all_messages(descriptor: Descriptor, prefix: str = ""):
    yield prefix + descriptor.name, descriptor
    for nested in descriptor.nested_types:
        if not nested.GetOptions().map_entry:
            yield from all_messages(nested, prefix + descriptor.name + ".")


CASES = [pair for message in OURS.values() for pair in all_messages(message)]


@pytest.mark.parametrize(("path", "descriptor"), CASES, ids=[path for path, _ in CASES])
def test_fields_match_triton(path: str, descriptor: Descriptor):
    top, *nested = path.split(".")
    theirs = triton_message(top)
    for name in nested:
        theirs = theirs.nested_types_by_name[name]
    for field in descriptor.fields:
        their_field = theirs.fields_by_number.get(field.number)
        assert their_field is not None, f"{path}.{field.name} = {field.number} is not in Triton's message"
        assert signature(field) == signature(their_field), f"{path}.{field.name}"


def test_enum_values_match_triton():
    theirs = {value.name: value.number for value in model_config_pb2.DataType.DESCRIPTOR.values}
    mine = {value.name: value.number for value in ours.DataType.DESCRIPTOR.values}
    assert mine.items() <= theirs.items()


def test_the_service_path_is_tritons():
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == SERVICE_NAME
