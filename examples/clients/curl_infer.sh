#!/usr/bin/env bash
# Call the example server (`make serve`) with curl: metadata, then one inference on `simple`.
set -euo pipefail
URL=${URL:-http://localhost:8080}
curl -s "$URL/v2/models/simple"
echo
curl -s -X POST "$URL/v2/models/simple/infer" -d '{
  "id": "curl-1",
  "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
              "data": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}]
}'
echo
