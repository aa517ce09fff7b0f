-- wrk script: print one JSON summary line at the end (latency percentiles
-- wrk's own output lacks, such as p95).
function done(summary, latency, requests)
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_s":%.3f,"rps":%.1f,"p50_ms":%.2f,"p95_ms":%.2f,"p99_ms":%.2f,' ..
    '"max_ms":%.2f,"non_2xx_3xx":%d,"socket_errors":%d}\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(95) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
