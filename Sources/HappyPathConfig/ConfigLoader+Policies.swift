import Foundation
import HappyPathCore
import HappyPathPolicies
import Yams

/// The policy keys `defaults`, an upstream and a route share: each block
/// read into its policy's `Partial` (docs/configuration.md).
extension Reader {
    static let policyKeys = ["timeout", "retry", "circuit_breaker", "reachability", "health_check", "outlier_detection"]

    /// Policy keys of an upstream (or `defaults`) that a route may not set.
    static let upstreamOnlyPolicyKeys = ["circuit_breaker", "health_check", "outlier_detection"]

    func policies(_ f: [String: (key: Node, value: Node)], _ path: String) -> PolicySettings {
        var p = PolicySettings()
        p.timeout.set(\.timeout, duration(f["timeout"]?.value, "\(path).timeout"))
        if let r = f["retry"]?.value {
            let rp = "\(path).retry"
            let rf = fields(
                r, rp,
                known: [
                    "attempts", "per_try_timeout", "on", "backoff", "honor_retry_after", "max_retry_after", "budget",
                    "methods",
                ])
            p.retry.set(\.attempts, int(rf["attempts"]?.value, "\(rp).attempts", min: 1, max: 100))
            p.retry.set(\.perTryTimeout, duration(rf["per_try_timeout"]?.value, "\(rp).per_try_timeout"))
            if let on = rf["on"]?.value, let list = strings(on, "\(rp).on") {
                for item in list where !["connect-failure", "reset", "timeout"].contains(item) {
                    if let code = Int(item), (500...599).contains(code) || code == 429 || code == 408 { continue }
                    if let status = GRPCStatus(configName: item) {
                        if RetryPolicy.Configuration.retryableGRPC.contains(status) { continue }
                        error(on, "\(rp).on: '\(item)' is a gRPC status no retry can mend; the gRPC names it takes are "
                            + RetryPolicy.Configuration.retryableGRPC.map(\.configName).joined(separator: ", "))
                        continue
                    }
                    error(on, "\(rp).on: '\(item)' is not connect-failure, reset, timeout, a 5xx/408/429 status "
                        + "or a gRPC status name (\(RetryPolicy.Configuration.retryableGRPC.map(\.configName).joined(separator: ", ")))")
                }
                p.retry.set(\.on, Set(list))
            }
            if let b = rf["backoff"]?.value {
                let bf = fields(b, "\(rp).backoff", known: ["base", "max", "jitter"])
                let base = duration(bf["base"]?.value, "\(rp).backoff.base")
                let max = duration(bf["max"]?.value, "\(rp).backoff.max")
                p.retry.set(\.backoffBase, base)
                p.retry.set(\.backoffMax, max)
                p.retry.set(\.jitter, choice(bf["jitter"]?.value, "\(rp).backoff.jitter", Jitter.self).map { $0 == .full })
                if let base, let max, max < base {
                    error(bf["max"]?.value, "\(rp).backoff.max must not be shorter than backoff.base")
                }
            }
            p.retry.set(\.honorRetryAfter, bool(rf["honor_retry_after"]?.value, "\(rp).honor_retry_after"))
            let cap = duration(rf["max_retry_after"]?.value, "\(rp).max_retry_after")
            p.retry.set(\.maxRetryAfter, cap)
            if let cap, cap < .seconds(1) {
                error(rf["max_retry_after"]?.value, "\(rp).max_retry_after must be at least 1s")
            }
            if let b = rf["budget"]?.value {
                let bf = fields(b, "\(rp).budget", known: ["ratio", "min_per_second"])
                p.retryBudget.set(\.ratio, double(bf["ratio"]?.value, "\(rp).budget.ratio", min: 0, max: 1))
                p.retryBudget.set(\.minPerSecond, int(bf["min_per_second"]?.value, "\(rp).budget.min_per_second"))
            }
            if let m = rf["methods"]?.value { p.retry.set(\.methods, methods(m, "\(rp).methods").map(Set.init)) }
        }
        if let c = f["circuit_breaker"]?.value {
            let cp = "\(path).circuit_breaker"
            let cf = fields(
                c, cp,
                known: [
                    "consecutive_failures", "failure_rate", "minimum_requests", "window", "open_for",
                    "half_open_probes", "while_open",
                ])
            p.circuitBreaker.set(
                \.consecutiveFailures, int(cf["consecutive_failures"]?.value, "\(cp).consecutive_failures", min: 1))
            p.circuitBreaker.set(\.failureRate, double(cf["failure_rate"]?.value, "\(cp).failure_rate", min: 0, max: 1))
            p.circuitBreaker.set(\.minimumRequests, int(cf["minimum_requests"]?.value, "\(cp).minimum_requests", min: 1))
            p.circuitBreaker.set(\.window, duration(cf["window"]?.value, "\(cp).window"))
            p.circuitBreaker.set(\.openFor, duration(cf["open_for"]?.value, "\(cp).open_for"))
            p.circuitBreaker.set(\.halfOpenProbes, int(cf["half_open_probes"]?.value, "\(cp).half_open_probes", min: 1))
            p.circuitBreaker.set(
                \.whileOpen,
                choice(cf["while_open"]?.value, "\(cp).while_open", CircuitBreakerStateMachine.WhileOpen.self))
        }
        if let r = f["reachability"]?.value {
            let rf = fields(r, "\(path).reachability", known: ["park_for"])
            p.reachability.set(
                \.parkFor, duration(rf["park_for"]?.value, "\(path).reachability.park_for", allowZero: true))
        }
        if let o = f["outlier_detection"]?.value {
            let op = "\(path).outlier_detection"
            let of = fields(o, op, known: ["consecutive_failures", "base_ejection", "max_ejected_percent"])
            p.outlierDetection.set(
                \.consecutiveFailures, int(of["consecutive_failures"]?.value, "\(op).consecutive_failures", min: 1))
            p.outlierDetection.set(\.baseEjection, duration(of["base_ejection"]?.value, "\(op).base_ejection"))
            p.outlierDetection.set(
                \.maxEjectedPercent, int(of["max_ejected_percent"]?.value, "\(op).max_ejected_percent", min: 0, max: 100))
        }
        if let h = f["health_check"]?.value {
            let hp = "\(path).health_check"
            let hf = fields(h, hp, known: ["path", "grpc", "interval", "timeout", "unhealthy_after", "healthy_after"])
            if let s = string(hf["path"]?.value, "\(hp).path") {
                if s.hasPrefix("/") {
                    p.healthCheck.set(\.path, s)
                } else {
                    error(hf["path"]?.value, "\(hp).path must start with /")
                }
            }
            if let g = hf["grpc"]?.value {
                let gf = fields(g, "\(hp).grpc", known: ["service"])
                var grpc = HealthCheckConfiguration.GRPC()
                if let s = string(gf["service"]?.value, "\(hp).grpc.service") { grpc.service = s }
                p.healthCheck.set(\.grpc, grpc)
            }
            p.healthCheck.set(\.interval, duration(hf["interval"]?.value, "\(hp).interval"))
            p.healthCheck.set(\.timeout, duration(hf["timeout"]?.value, "\(hp).timeout"))
            p.healthCheck.set(\.unhealthyAfter, int(hf["unhealthy_after"]?.value, "\(hp).unhealthy_after", min: 1))
            p.healthCheck.set(\.healthyAfter, int(hf["healthy_after"]?.value, "\(hp).healthy_after", min: 1))
        }
        return p
    }
}
