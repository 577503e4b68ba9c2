"""Call the example server with KServe's own Python clients (REST and gRPC, Open Inference Protocol v2).

pip install kserve
python examples/clients/kserve_infer.py [localhost:8080] [localhost:8081]

KServe's gRPC client registers the same protobuf names as tritonclient's: use one or the other in a
process, not both.
"""

import asyncio
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


def request(model: str, binary: bool = False) -> InferRequest:
    x = np.arange(32, dtype=np.float32).reshape(2, 16) / 10
    tensor = InferInput(name="INPUT0", shape=list(x.shape), datatype="FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return InferRequest(model_name=model, infer_inputs=[tensor], request_id="kserve-1")


async def main(http: str, grpc: str) -> None:
    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    base = f"http://{http}"
    print(
        "rest live:", await rest.is_server_live(base), "| ready:", await rest.is_model_ready(base, "simple")
    )
    result = await rest.infer(base, request("simple"), model_name="simple")
    output = result.outputs[0]
    print("rest", output.name, output.shape, output.as_numpy()[0, :4], "| id:", result.id)
    result = await rest.infer(base, request("simple", binary=True), model_name="simple")  # binary extension
    print("rest binary", result.outputs[0].shape, result.outputs[0].as_numpy()[0, :4])
    await rest.close()

    client = InferenceGRPCClient(grpc, timeout=30)
    print("grpc live:", await client.is_server_live(), "| ready:", await client.is_model_ready("simple"))
    result = await client.infer(request("simple"))
    output = result.outputs[0]
    print("grpc", output.name, output.shape, output.as_numpy()[0, :4], "| id:", result.id)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(*(sys.argv[1:3] if len(sys.argv) > 2 else ("localhost:8080", "localhost:8081"))))
