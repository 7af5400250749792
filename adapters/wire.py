"""The gRPC messages and stubs of ``proto/eva/base/v1/base.proto``, generated at import time.

``grpc.protos_and_services`` runs the protobuf compiler of grpcio-tools on the .proto file, so
generated code never lives in the repository and cannot drift from the interface.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grpc

PROTO_ROOT = Path(__file__).resolve().parents[1] / "proto"
if str(PROTO_ROOT) not in sys.path:
    sys.path.append(str(PROTO_ROOT))

base_pb2: Any
base_pb2_grpc: Any
base_pb2, base_pb2_grpc = grpc.protos_and_services("eva/base/v1/base.proto")

SERVICE_NAME = "eva.base.v1.BaseService"
