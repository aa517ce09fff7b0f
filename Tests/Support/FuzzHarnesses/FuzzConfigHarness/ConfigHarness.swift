// The check of the FuzzConfig target, in a library so that the fuzz
// executable and the seed replay tests (HappyPathFuzzSeedTests) run the same
// code: whatever the file holds, loading it never crashes, and every problem
// it reports reads `FILE:LINE:COL: message` with a position inside the file.
//
// An input is used two ways:
//  - as a whole YAML file (random YAML);
//  - as a key and a scalar: the first byte picks one of the keys of a
//    complete, valid configuration (every key there is), the rest becomes
//    that key's value (plain, or quoted when the second byte is odd), and
//    the other keys keep their valid values.
import HappyPathConfig

/// Every key of the configuration, each with `@N@` where the fuzzer's value
/// may go; the values here are valid.
let template = """
    listen:
      - @0@
      - address: @94@
        tls: { certificates: [ { cert: @95@, key: @96@ } ], min_version: @97@, alpn: [http/1.1] }
    workers: @1@
    drain_timeout: @2@
    admin: { listen: @3@, allow_remote: @4@, allowed_hosts: [@79@, localhost] }
    limits:
      max_request_body: @5@
      max_header_bytes: @6@
      client_timeout: @7@
      max_parked: @8@
      encoded_slashes: @73@
      stale_max_bytes: @88@
      stale_max_entry: @89@
      max_connections: @90@
    normalize: { merge_slashes: @74@ }
    defaults:
      timeout: @9@
      retry:
        attempts: @10@
        per_try_timeout: @11@
        on: [@12@, 503]
        backoff: { base: @13@, max: @14@, jitter: @15@ }
        honor_retry_after: @16@
        budget: { ratio: @17@, min_per_second: @18@ }
        methods: [@19@, HEAD]
      circuit_breaker:
        consecutive_failures: @20@
        failure_rate: @21@
        minimum_requests: @22@
        window: @23@
        open_for: @24@
        half_open_probes: @25@
        while_open: @26@
      reachability: { park_for: @27@ }
      health_check: { path: @28@, interval: @29@, timeout: @30@, unhealthy_after: @31@, healthy_after: @32@ }
    upstreams:
      api:
        endpoints: [@33@]
        connect_timeout: @34@
        max_connections: @35@
        outlier_detection: { consecutive_failures: @91@, base_ejection: @92@, max_ejected_percent: @93@ }
      secure:
        endpoints: [https://10.0.0.1:443]
        tls: { ca: @98@, verify: @99@, server_name: @100@, client_cert: /etc/c.crt, client_key: /etc/c.key }
        auth:
          kind: @36@
          token_url: @37@
          client_id: @38@
          client_secret: @39@
          scope: @40@
          audience: @41@
          header: @42@
          scheme: @43@
          refresh_ahead: @44@
          refresh_on: [@45@]
          token_pointer: @46@
          expires_in_pointer: @47@
        errors:
          - when: { status: @48@, json_pointer: @49@, equals: @50@ }
            code: @51@
            title: @52@
            detail: @53@
            recovery_suggestion: @54@
            recovery_options: [@55@]
            retryable: @56@
    tracing: { otlp_endpoint: @103@, sample_ratio: @104@, service_name: @105@ }
    storage: { path: @63@, sync: @64@, max_bytes: @65@, retention: @66@, status_path: @67@ }
    routes:
      - match: { path_prefix: @57@, methods: [@58@] }
        upstream: @59@
        strip_prefix: @60@
        timeout: @61@
        retry: { attempts: @62@ }
        allow_trace: @75@
        redirects: @76@
        upstream_errors: @77@
        delivery: { mode: @68@, max_age: @69@, max_attempts: @70@, backoff: { base: @71@, max: @72@ }, idempotency: { client_header: @78@ } }
      - match: { path_prefix: @80@ }
        upstream: api
        hedge: { after: @81@, max_extra: @82@ }
        fallback: { serve_stale: @83@, on: [@84@, timeout], response: { status: @85@, content_type: @86@, body: @87@ } }
        upgrades: [@101@]
        upgrades_idle_timeout: @102@
    """

let valid = [
    "127.0.0.1:8080", "2", "20s", "127.0.0.1:9901", "false", "10MiB", "64KiB", "30s", "10000", "10s", "3", "3s",
    "connect-failure", "50ms", "2s", "full", "true", "0.2", "10", "GET", "5", "0.5", "20", "10s", "5s", "1", "park", "10s",
    "/healthz", "2s", "1s", "3", "1", "http://127.0.0.1:9000", "1s", "256", "oauth2_client_credentials",
    "https://auth.example.com/token", "id", "secret", "read", "api", "Authorization", "Bearer", "30s", "401",
    "/access_token", "/expires_in", "409", "/error/code", "busy", "CONFLICT_TRY_AGAIN", "Busy", "Try later", "Wait",
    "retry", "true", "/api/", "GET", "api", "/api", "5s", "4",
    "/var/lib/happypath/deliveries.db", "full", "1GiB", "24h", "/_happypath/deliveries", "later", "24h", "50", "1s", "10m",
    "keep", "false", "false", "rewrite", "pass", "X-Api-Key", "admin.example.com",
    "/catalog/", "50ms", "1", "10m", "5xx", "200", "application/json", "degraded", "64MiB", "1MiB",
    "10000", "5", "10s", "50",
    "127.0.0.1:8443", "/etc/tls/api.crt", "/etc/tls/api.key", "1.3", "/etc/ssl/ca.pem", "true", "api.internal",
    "websocket", "5m", "http://otel:4318/v1/traces", "0.1", "edge",
]

func render(replacing slot: Int?, with value: String) -> String {
    var text = template
    for (i, v) in valid.enumerated() {
        text = text.replacingOccurrences(of: "@\(i)@", with: i == slot ? value : v)
    }
    return text
}

/// Lines as YAML counts them: CR LF, CR, LF, NEL, LS and PS each end one.
func lineCount(_ text: String) -> Int {
    var lines = 1
    var previous: Unicode.Scalar = " "
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\n": if previous != "\r" { lines += 1 }
        case "\r", "\u{85}", "\u{2028}", "\u{2029}": lines += 1
        default: break
        }
        previous = scalar
    }
    return lines
}

/// Loads `text`; traps if loading crashed the checks below.
func load(_ text: String) -> String {
    let lines = lineCount(text)
    do {
        _ = try ConfigLoader.parse(text, file: "fuzz.yaml", environment: ["SECRET": "s"])
        return "valid"
    } catch {
        precondition(!error.errors.isEmpty, "an error without a problem")
        for e in error.errors {
            let d = e.description
            precondition(d.hasPrefix("fuzz.yaml:"), "not FILE:LINE:COL: \(d)")
            let parts = d.split(separator: ":", maxSplits: 3, omittingEmptySubsequences: false)
            precondition(parts.count == 4, "not FILE:LINE:COL: message: \(d)")
            let line = Int(parts[1]), column = Int(parts[2])
            precondition(line != nil && column != nil, "no line or column: \(d)")
            precondition(line! >= 1 && line! <= lines + 1, "line \(line!) outside the file: \(d)")
            precondition(column! >= 1, "column \(column!) before the line: \(d)")
            precondition(parts[3].count > 1, "an empty message: \(d)")
            precondition(!e.message.contains("\n"), "a message over several lines: \(d)")
        }
        return "\(error.errors.count) problem(s): \(error.errors[0])"
    }
}

public enum ConfigHarness {
    /// What loading the template with its valid values says: "valid", or
    /// its problems (a key added to the template with a value that is not).
    public static func templateAsWritten() -> String { load(render(replacing: nil, with: "")) }

    /// Loads `bytes` as a whole file, then as one key's value in a valid
    /// configuration; traps on a crash or a badly placed problem.
    public static func check(_ bytes: [UInt8]) -> String {
        let whole = load(String(decoding: bytes, as: UTF8.self))
        guard bytes.count >= 2 else { return whole }
        let slot = Int(bytes[0]) % valid.count
        // One line: the value must stay the value of its key.
        var value = String(decoding: bytes.dropFirst(2).map { $0 == 0x0A || $0 == 0x0D ? 0x20 : $0 }, as: UTF8.self)
        if bytes[1] & 1 == 1 {
            value = "\"" + value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
        }
        return "whole: \(whole); key \(slot): \(load(render(replacing: slot, with: value)))"
    }
}
