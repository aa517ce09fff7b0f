import Foundation
import HappyPathCore
import Logging

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
        sink: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data($0.utf8)) }
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

    public func log(event: LogEvent) {
        var merged = metadata
        if let extra = event.metadata { merged.merge(extra) { $1 } }
        let ts = Date().formatted(.iso8601.year().month().day().time(includingFractionalSeconds: true))
        var line: String
        switch format {
        case .json:
            line = "{\"ts\":\"\(ts)\",\"level\":\"\(event.level)\",\"msg\":\(JSON.quote(event.message.description))"
            for (key, value) in merged.sorted(by: { $0.key < $1.key }) {
                line += ",\(JSON.quote(key)):\(Self.render(value))"
            }
            line += "}\n"
        case .text:
            line = "\(ts) \(event.level.rawValue.uppercased()) \(event.message)"
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
