-- wrk script for deploy/bench/deliver-later.sh: POSTs a 200-byte JSON body
-- and prints one JSON summary line at the end (p50 and p99 included).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"event":"order.created","order":"ord_7f3a9c2e4b1d6a80","customer":"cus_4e1b9d","amount_cents":12345,'
    .. '"currency":"EUR","items":[{"sku":"sku-0001","qty":2},{"sku":"sku-0002","qty":1}],"note":"deliver-later bench"}'

function done(summary, latency, requests)
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_s":%.3f,"rps":%.1f,"p50_ms":%.3f,"p99_ms":%.3f,"max_ms":%.2f,' ..
    '"non_2xx_3xx":%d,"socket_errors":%d,"body_bytes":%d}\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout, #wrk.body))
end
