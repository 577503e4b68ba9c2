-- wrk script: POST the body file named by BENCH_BODY (with BENCH_HEADERS "k: v;k: v"), print a JSON summary.
wrk.method = "POST"
local file = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.body = file:read("*a")
file:close()
local extra = os.getenv("BENCH_HEADERS") or ""
for key, value in string.gmatch(extra, "([^:;]+):%s*([^;]+)") do
  wrk.headers[key] = value
end

done = function(summary, latency, requests)
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, "status_errors": %d, "socket_errors": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
