import Foundation
import HappyPathCore
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// Log output format of `serve` (`--log-format`).
public enum LogFormat: String, Sendable, CaseIterable {
    case json, text
}

/// swift-log handler writing one line per event to stderr: a JSON object
/// (`ts`, `level`, `msg`, then metadata) or, for people, a text line.
public struct LineLogHandler: LogHandler {
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    let label: String
    let format: LogFormat

    /// Where finished lines go; stderr by default.
    let sink: @Sendable (String) -> Void

    public init(
        label: String, format: LogFormat, level: Logger.Level,
        sink: @escaping @Sendable (String) -> Void = LineLogHandler.writeToStderr
    ) {
        self.label = label
        self.format = format
        self.logLevel = level
        self.sink = sink
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// One write(2) per line, straight from the string's bytes.
    public static let writeToStderr: @Sendable (String) -> Void = { line in
        var line = line
        line.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let n = write(2, bytes.baseAddress! + offset, bytes.count - offset)
                if n <= 0 { return }
                offset += n
            }
        }
    }

    public func log(event: LogEvent) {
        var merged = event.metadata ?? [:]
        if !metadata.isEmpty { merged.merge(metadata) { event, _ in event } }
        let ts = Timestamp.now()
        var line = ""
        line.reserveCapacity(96 + 40 * merged.count)
        switch format {
        case .json:
            line += "{\"ts\":\""
            line += ts
            line += "\",\"level\":\""
            line += event.level.rawValue
            line += "\",\"msg\":"
            line += JSON.quote(event.message.description)
            for (key, value) in merged.sorted(by: { $0.key < $1.key }) {
                line += ","
                line += JSON.quote(key)
                line += ":"
                line += Self.render(value)
            }
            line += "}\n"
        case .text:
            line += ts + " " + event.level.rawValue.uppercased() + " " + event.message.description
            for (key, value) in merged.sorted(by: { $0.key < $1.key }) { line += " \(key)=\(value)" }
            line += "\n"
        }
        sink(line)
    }

    static func render(_ value: Logger.MetadataValue) -> String {
        switch value {
        case let .string(s): return JSON.quote(s)
        case let .stringConvertible(c):
            // Numbers stay numbers in the JSON line.
            let s = c.description
            return c is any BinaryInteger || c is Double ? s : JSON.quote(s)
        case let .array(items): return "[" + items.map(render).joined(separator: ",") + "]"
        case let .dictionary(d):
            return "{" + d.sorted { $0.key < $1.key }.map { "\(JSON.quote($0.key)):\(render($0.value))" }.joined(separator: ",")
                + "}"
        }
    }
}

extension Logger {
    /// A logger that writes JSON or text lines to stderr.
    public static func happypath(format: LogFormat = .json, level: Logger.Level = .info) -> Logger {
        Logger(label: "happypath") { label in LineLogHandler(label: label, format: format, level: level) }
    }
}

/// `2026-11-22T01:15:38.718` (UTC) without Foundation's formatters, which
/// cost microseconds per line: the access log writes one per request.
enum Timestamp {
    static func now() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        var t = time_t(ts.tv_sec)
        var parts = tm()
        gmtime_r(&t, &parts)
        let millis = Int(ts.tv_nsec / 1_000_000)
        return String(unsafeUninitializedCapacity: 23) { out in
            var i = 0
            func put(_ value: Int, _ width: Int) {
                var v = value
                for k in stride(from: width - 1, through: 0, by: -1) {
                    out[i + k] = UInt8(ascii: "0") + UInt8(v % 10)
                    v /= 10
                }
                i += width
            }
            func sep(_ c: Character) {
                out[i] = c.asciiValue!
                i += 1
            }
            put(Int(parts.tm_year) + 1900, 4); sep("-"); put(Int(parts.tm_mon) + 1, 2); sep("-"); put(Int(parts.tm_mday), 2)
            sep("T"); put(Int(parts.tm_hour), 2); sep(":"); put(Int(parts.tm_min), 2); sep(":"); put(Int(parts.tm_sec), 2)
            sep("."); put(millis, 3)
            return i
        }
    }
}
