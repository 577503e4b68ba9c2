"""bench/request_cost.py: the in-process harness that counts what a request costs the server's code."""

from __future__ import annotations

import uvloop

from bench import request_cost


def test_the_harness_feeds_the_real_server_one_request_at_a_time_and_reads_its_answers():
    config = request_cost.config_file("tiny", request_cost.LARGE_SLO_MS)
    result = uvloop.run(request_cost.drive(config, "tiny", 20))
    assert result["statuses"] == {"200": request_cost.WARMUP + 20}  # nothing refused, nothing lost
    assert result["last_answer"].startswith("HTTP/1.1 200 OK\r\n")
    assert '"model_name":"tiny"' in result["last_answer"]
    assert result["us_per_request"] > 0


REPORT = """\
--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
9,000,000 (100.0%)  build/__native_edgeinfer.c:CPyDef_http___V2Routes____reply [/x/edgeinfer__mypyc.so]
9,000,000 (100.0%)  /w/build/__native_edgeinfer.c:CPyDef_http___V2Routes____reply
4,500,000 (50.00%)  build/__native_edgeinfer.c:CPyDef_json_codec___encode_response [/x/edgeinfer__mypyc.so]
1,000,000 (11.11%)  /x/Objects/call.c:PyObject_Vectorcall [/x/libpython3.11.so.1.0]
"""


def test_callgrinds_inclusive_counts_of_compiled_functions_become_counts_per_request():
    assert request_cost.per_request(REPORT, 1_000) == {
        "http___V2Routes____reply": 9_000,
        "json_codec___encode_response": 4_500,
    }
