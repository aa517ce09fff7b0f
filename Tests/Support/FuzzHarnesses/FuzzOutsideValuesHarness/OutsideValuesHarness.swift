// The check of the FuzzOutsideValues target, in a library so that the fuzz
// executable and the seed replay tests (HappyPathFuzzSeedTests) run the same
// code. The first byte picks the reader, the rest is the value as it came
// from outside (a seed file is `<kind letter><value>`, e.g. `r9223372036`).
// Each reader must not trap, and its result must be within its bound.
import Foundation
import HappyPathCore
import HappyPathPolicies

public enum OutsideValuesHarness {
    /// Wall clocks the dates are read against: now, the epoch, and the far ends.
    static let clocks: [Int64] = [1_700_000_000, 0, -1, .max, .min, HTTPDate.latest, HTTPDate.earliest]

    public static func check(_ bytes: [UInt8]) -> String {
        guard let kind = bytes.first else { return "empty" }
        let value = Array(bytes.dropFirst())
        let text = String(decoding: value, as: UTF8.self)
        switch kind {
        case UInt8(ascii: "d"):  // delta-seconds: Age, max-age, stale-if-error, RateLimit t
            for cap in [0, 1, 3600, OutsideValues.maxSeconds, .max, .min] as [Int64] {
                if let s = OutsideValues.deltaSeconds(value, cap: cap) {
                    precondition(s >= 0 && s <= max(0, min(cap, OutsideValues.maxSeconds)), "delta-seconds \(s) past cap \(cap)")
                    precondition(value.contains { $0 >= 0x30 && $0 <= 0x39 }, "delta-seconds read from no digit")
                }
            }
            return "\(OutsideValues.deltaSeconds(value).map(String.init) ?? "absent")"
        case UInt8(ascii: "r"):  // Retry-After
            var out = "absent"
            for now in clocks {
                for cap in [Duration.seconds(1), .seconds(3600), .seconds(Int64.max), .zero, .nanoseconds(-5)] {
                    guard let s = RetryAfter.seconds(value, nowUnixSeconds: now, max: cap) else { continue }
                    precondition(s >= 0 && s <= OutsideValues.wholeSeconds(cap), "Retry-After \(s) past \(cap)")
                    // The String reader sees the same bytes only when they are valid UTF-8.
                    let d = RetryAfter.parse(text, nowUnixSeconds: now, max: cap)
                    precondition(!text.utf8.elementsEqual(value) || d == .seconds(s), "the two readers differ")
                    _ = Instant(nanoseconds: .max - 5) + (d ?? .zero)  // saturates, never traps
                    out = "\(s)"
                }
            }
            return out
        case UInt8(ascii: "h"):  // HTTP-date
            guard let date = HTTPDate.parse(value) else { return "absent" }
            precondition(date >= HTTPDate.earliest && date <= HTTPDate.latest, "date \(date) outside years 0000-9999")
            return "\(date)"
        case UInt8(ascii: "l"):  // RateLimit, with and without a Retry-After
            for now in clocks {
                if let d = PacingSignal.wait(retryAfter: nil, rateLimit: text, nowUnixSeconds: now) {
                    precondition(d >= .zero && d <= .seconds(OutsideValues.maxSeconds), "RateLimit wait \(d) out of range")
                }
                if let d = PacingSignal.wait(retryAfter: text, rateLimit: text, nowUnixSeconds: now) {
                    precondition(d >= .zero && d <= .seconds(OutsideValues.maxSeconds), "pacing wait \(d) out of range")
                }
            }
            return "ok"
        case UInt8(ascii: "e"):  // expires_in, as JSON (the value is the JSON text after `"expires_in":`)
            let body = Array("{\"access_token\":\"t\",\"expires_in\":".utf8) + value + Array("}".utf8)
            let asString = Array("{\"access_token\":\"t\",\"expires_in\":\"".utf8) + value + Array("\"}".utf8)
            var out = "absent"
            for json in [body, asString] {
                guard case let .success(response) = TokenResponse.oauth2(json), let lifetime = response.expiresIn else {
                    continue
                }
                precondition(
                    lifetime >= TokenStateMachine.minimumLifetime && lifetime <= .seconds(OutsideValues.maxSeconds),
                    "expires_in read as \(lifetime)")
                // A token with it, used and refreshed ahead at the far ends of the clock.
                for start: Int64 in [0, 1_000_000_000, Int64.max / 2] {
                    var machine = TokenStateMachine(refreshAhead: .seconds(30))
                    let now = Instant(nanoseconds: start)
                    machine.succeeded(credential: Secret("Bearer t"), expiresIn: lifetime, at: now)
                    _ = machine.use(at: now + lifetime)
                    _ = machine.reserveRequest(at: now)
                    _ = machine.expiresIn(at: now)
                }
                out = "\(lifetime)"
            }
            return out
        case UInt8(ascii: "f"):  // a floating-point lifetime as 8 raw bytes (NaN, infinities, extremes)
            var raw: UInt64 = 0
            for byte in value.prefix(8) { raw = raw << 8 | UInt64(byte) }
            let seconds = Double(bitPattern: raw)
            if let d = OutsideValues.lifetimeSeconds(seconds) {
                precondition(seconds.isFinite && seconds > 0, "a lifetime from \(seconds)")
                precondition(d >= .seconds(1) && d <= .seconds(OutsideValues.maxSeconds), "lifetime \(d)")
            }
            let duration = Duration.seconds(seconds.isFinite ? max(-9e18, min(9e18, seconds)) : 0)
            _ = duration.nanoseconds
            _ = OutsideValues.wholeSeconds(duration)
            return "ok"
        case UInt8(ascii: "c"):  // Cache-Control, for stale-if-error
            let decision = StaleRules.decide(
                method: "GET", status: 200, fields: [HTTPField(name: "Cache-Control", value: text)],
                requestHasCredentials: false, serveStale: .seconds(3600))
            if let decision { precondition(decision.keepFor > .zero && decision.keepFor <= .seconds(3600), "kept too long") }
            return decision.map { "\($0.keepFor)" } ?? "not kept"
        case UInt8(ascii: "t"):  // traceparent
            guard let context = value.withUnsafeBytes({ TraceContext.parse($0) }) else { return "invalid" }
            precondition(context.traceHigh | context.traceLow != 0 && context.spanID != 0, "an all-zero id read as valid")
            precondition(value.count >= 55 && !value.prefix(55).contains { $0 >= 0x41 && $0 <= 0x46 }, "upper case or short read as valid")
            let again = TraceContext.parse(context.traceparent(span: context.spanID))
            precondition(again?.traceHigh == context.traceHigh && again?.spanID == context.spanID, "no round trip")
            return "valid"
        case UInt8(ascii: "g"):  // grpc-timeout
            guard let d = GRPCTimeout.parse(text) else { return "refused" }
            precondition(value.count >= 2 && value.count <= 9, "grpc-timeout read from \(value.count) bytes")
            precondition(d >= .zero && d <= .seconds(99_999_999 * 3600), "grpc-timeout \(d) out of range")
            _ = Instant(nanoseconds: .max - 5) + d  // saturates, never traps
            if let again = GRPCTimeout.format(d) {
                precondition(GRPCTimeout.parse(again).map { $0 <= d && $0 > .zero } == true, "\(again) for \(d)")
            } else {
                precondition(d == .zero, "no grpc-timeout written for \(d)")
            }
            return "\(d)"
        case UInt8(ascii: "m"):  // grpc-message
            let decoded = GRPCMessage.decode(value)
            for limit in [0, 3, 64, 2048] {
                let encoded = GRPCMessage.encode(decoded, limit: limit)
                precondition(encoded.utf8.count <= limit, "grpc-message past its limit")
                precondition(encoded.utf8.allSatisfy { $0 >= 0x20 && $0 <= 0x7E }, "grpc-message not printable ASCII")
                precondition(
                    decoded.unicodeScalars.starts(with: GRPCMessage.decode(encoded).unicodeScalars),
                    "a cut grpc-message is not a prefix")
            }
            // Unbounded both ways: the text may encode to more than decode reads by default.
            let again = GRPCMessage.decode(GRPCMessage.encode(decoded, limit: .max), limit: .max)
            precondition(again == decoded, "no round trip")
            return decoded
        case UInt8(ascii: "s"):  // grpc-status
            guard let status = GRPCStatus(fieldValue: text) else { return "unknown" }
            precondition(status.rawValue >= 0 && status.rawValue <= 16 && value.count <= 3, "grpc-status \(status)")
            return status.name
        case UInt8(ascii: "i"):  // grpc-status-details-bin: a RetryInfo's delay (pacing on RESOURCE_EXHAUSTED)
            for cap in [Duration.zero, .seconds(1), .seconds(3600)] {
                let delay = value.withUnsafeBytes { GRPCStatusDetails.retryDelay(fieldValue: $0, max: cap) }
                if let delay { precondition(delay > .zero && delay <= cap, "RetryInfo delay \(delay) past \(cap)") }
            }
            return value.withUnsafeBytes { GRPCStatusDetails.retryDelay(fieldValue: $0, max: .seconds(3600)) }
                .map { "\($0)" } ?? "none"
        case UInt8(ascii: "k"):  // a gRPC health check's answer body (grpc-status 0 in the trailers)
            var answer = GRPCHealthCheck.Answer()
            answer.received(status: 200)
            // The body in two pieces, cut where its first byte says, as it may arrive.
            let cut = value.first.map { Int($0) % (value.count + 1) } ?? 0
            answer.received(body: value[..<cut])
            answer.received(body: value[cut...])
            Array("grpc-status".utf8).withUnsafeBytes { n in Array("0".utf8).withUnsafeBytes { answer.received(trailer: n, value: $0) } }
            switch answer.verdict {
            case .serving: return "serving"
            case let .alive(why): return "alive: " + why
            case let .down(why): return why
            }
        case UInt8(ascii: "b"):  // a gRPC-Web text body (base64), in two splits; and the value encoded and read back
            func decode(_ split: Int) -> (bytes: [UInt8], failed: Bool) {
                var decoder = GRPCWebTextDecoder()
                var out: [UInt8] = []
                var at = 0
                while at < value.count {
                    let end = min(value.count, at + split)
                    if decoder.feed(value[at..<end], into: &out) != nil { return (out, true) }
                    at = end
                }
                return (out, decoder.finish() != nil)
            }
            let whole = decode(max(1, value.count))
            let pieces = decode(Int(value.first ?? 1) % 5 + 1)
            precondition(whole.failed == pieces.failed, "a failure depends on how the body was split")
            precondition(whole.failed || whole.bytes == pieces.bytes, "the bytes depend on how the body was split")
            precondition(whole.bytes.count <= value.count * 3 / 4 + 3, "more bytes out than base64 can hold")
            var decoder = GRPCWebTextDecoder()
            var back: [UInt8] = []
            precondition(decoder.feed(GRPCWeb.base64(value), into: &back) == nil && decoder.finish() == nil, "own base64 refused")
            precondition(back == value, "base64 did not read back")
            // The bytes as a request body in either mode: refused, or whole frames the check walks to the end.
            let frames = value.withUnsafeBytes { GRPCWeb.frameProblem($0) }
            let body = RequestBody(count: value.count)
            if let base = body.baseAddress { value.withUnsafeBytes { base.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
            if case let .success(sent) = GRPCWebRequest.body(body, mode: .binary) {
                precondition(frames == nil && sent.count == value.count, "binary mode changed or let through a body")
            } else {
                precondition(frames != nil, "binary mode refused whole frames")
            }
            if case let .success(sent) = GRPCWebRequest.body(body, mode: .text) {
                precondition(!whole.failed && sent.count == whole.bytes.count, "text mode let a bad body through")
            }
            return whole.failed ? "refused" : "\(whole.bytes.count) bytes"
        case UInt8(ascii: "o"):  // coalesce: request fields (a key) and answer fields (a verdict), "name:value" lines
            var fields: [(name: ArraySlice<UInt8>, value: ArraySlice<UInt8>)] = []
            for line in value.split(separator: 0x0A, omittingEmptySubsequences: false) {
                guard let colon = line.firstIndex(of: 0x3A) else { continue }
                fields.append((line[line.startIndex..<colon], line[(colon + 1)...]))
            }
            let staleKey = StaleKey(privateHeaders: ["X-Api-Key"], rateLimitHeader: "X-Client")
            func key(_ method: String) -> String? {
                var reader = CoalesceRules.RequestReader(key: staleKey, salt: Array("fuzz".utf8))
                for field in fields {
                    field.name.withUnsafeBytes { n in field.value.withUnsafeBytes { v in reader.field(name: n, value: v) } }
                }
                return reader.key(
                    method: method, route: CoalesceRules.routeTag(0), upstream: "u", target: "/t", scheme: "http", pacingKey: nil)
            }
            let get = key("GET")
            precondition(get == key("GET"), "the same request made two keys")
            precondition((get == nil) == (key("HEAD") == nil) && (get == nil || get != key("HEAD")), "GET and HEAD share a key")
            precondition(key("POST") == nil, "a POST coalesced")
            var answer = KeptFields()
            for field in fields {
                field.name.withUnsafeBytes { n in field.value.withUnsafeBytes { v in _ = answer.append(name: n, value: v) } }
            }
            let verdict = CoalesceRules.head(fields: answer, contentLength: value.count, largeAbove: 64)
            let cookie = fields.contains { String(decoding: $0.name, as: UTF8.self).lowercased() == "set-cookie" }
            switch verdict {
            case let .share(vary):
                precondition(!cookie, "an answer that sets a cookie was shared")
                precondition(value.count <= 64, "a large answer was shared")
                // Names compare as ASCII without case (a byte past ASCII is compared as it is).
                precondition(
                    vary.allSatisfy { !$0.isEmpty && !$0.utf8.contains { $0 >= 0x41 && $0 <= 0x5A } }, "a Vary name not lower-cased")
                return "share \(get == nil ? "-" : "key") vary \(vary.count)"
            case let .release(reason):
                return "release \(reason.rawValue)"
            }
        default:
            return "no reader for \(kind)"
        }
    }
}
