"""gRPC server reflection, both versions: `grpc.reflection.v1` beside `v1alpha`.

grpcio-reflection ships only the v1alpha service, which gRPC has deprecated;
clients built on the current protocol (grpcurl 1.9 and later, Postman, grpcui,
Evans) ask for `grpc.reflection.v1.ServerReflection` first. The two versions
are the same messages with the same field numbers under another package, so
they are the same bytes on the wire: one servicer answers both, the v1 method
registered with the v1alpha message codecs. So that v1 is described like every
other service (`grpcurl describe grpc.reflection.v1.ServerReflection`), its
file descriptor, `grpc/reflection/v1/reflection.proto`, is added to the
descriptor pool: v1alpha's, renamed into the v1 package, as upstream defines it.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import _async as aio_reflection
from grpc_reflection.v1alpha import reflection_pb2 as alpha
from grpc_reflection.v1alpha import reflection_pb2_grpc as alpha_grpc

V1ALPHA_SERVICE = alpha.DESCRIPTOR.services_by_name["ServerReflection"].full_name
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def v1_file_descriptor(pool: descriptor_pool.DescriptorPool | None = None):
    """The v1 reflection file in `pool` (the default one), added on first use."""
    pool = pool or descriptor_pool.Default()
    try:
        return pool.FindFileByName(V1_FILE)
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    alpha.DESCRIPTOR.CopyToProto(proto)
    old = f".{alpha.DESCRIPTOR.package}."
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    proto.options.Clear()
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.java_outer_classname = "ServerReflectionProto"
    proto.options.java_multiple_files = True
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, f".{V1_PACKAGE}.")
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, f".{V1_PACKAGE}.")
            method.output_type = method.output_type.replace(old, f".{V1_PACKAGE}.")
    pool.AddSerializedFile(proto.SerializeToString())
    return pool.FindFileByName(V1_FILE)


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection, v1 and v1alpha, listing `service_names` and both reflection services."""
    v1_file_descriptor()
    servicer = aio_reflection.ReflectionServicer([*service_names, V1_SERVICE, V1ALPHA_SERVICE])
    alpha_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(V1_SERVICE, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=alpha.ServerReflectionRequest.FromString,
            response_serializer=alpha.ServerReflectionResponse.SerializeToString,
        ),
    })
    server.add_generic_rpc_handlers((v1,))
