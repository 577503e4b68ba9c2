"""Call the example server (`make serve`) with NVIDIA's tritonclient, unchanged from a Triton setup.

pip install 'tritonclient[http]'
python examples/clients/tritonclient_infer.py [localhost:8080]
"""

import sys

import numpy as np
import tritonclient.http as httpclient

url = sys.argv[1] if len(sys.argv) > 1 else "localhost:8080"
client = httpclient.InferenceServerClient(url)
print("ready:", client.is_server_ready(), "| model:", client.get_model_metadata("simple")["inputs"])

x = np.arange(32, dtype=np.float32).reshape(2, 16) / 10
tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
tensor.set_data_from_numpy(x, binary_data=False)
wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
result = client.infer("simple", [tensor], outputs=[wanted], model_version="2")
print("OUTPUT0:", result.as_numpy("OUTPUT0").shape, result.as_numpy("OUTPUT0")[0, :4])

text = httpclient.InferInput("TEXT", [2], "BYTES")
text.set_data_from_numpy(np.array([b"Hello", b"EDGE"], dtype=object), binary_data=False)
lower = client.infer(
    "text_lower", [text], outputs=[httpclient.InferRequestedOutput("LOWER", binary_data=False)]
)
print("LOWER:", lower.as_numpy("LOWER"))
