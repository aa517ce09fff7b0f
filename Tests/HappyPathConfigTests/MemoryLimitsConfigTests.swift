import Foundation
import HappyPathConfig
import Testing

/// Issue 43: `limits.connection_buffer` and `limits.max_buffered_per_client`,
/// their defaults and every refusal.
@Suite struct MemoryLimitsConfigTests {
    static func yaml(_ limits: String) -> String {
        """
        limits: \(limits)
        upstreams:
          api: { endpoints: [http://127.0.0.1:9000] }
        routes:
          - match: { path_prefix: / }
            upstream: api
        """
    }

    @Test func defaults() throws {
        let c = try ConfigLoader.parse(Self.yaml("{}"), file: "t.yaml")
        #expect(c.limits.connectionBuffer == 256 * 1024)
        #expect(c.limits.maxMemory == 1024 * 1024 * 1024)
        #expect(c.limits.maxBufferedPerClient == nil)
        #expect(c.limits.bufferedPerClient == 32 * 1024 * 1024, "an eighth of max_buffered_bytes (256MiB)")
        let small = try ConfigLoader.parse(Self.yaml("{ max_buffered_bytes: 8MiB }"), file: "t.yaml")
        #expect(small.limits.bufferedPerClient == 1024 * 1024)
    }

    @Test func everyKeyIsRead() throws {
        let c = try ConfigLoader.parse(
            Self.yaml("{ connection_buffer: 1MiB, max_buffered_bytes: 64MiB, max_buffered_per_client: 16MiB }"), file: "t.yaml")
        #expect(c.limits.connectionBuffer == 1024 * 1024)
        #expect(c.limits.bufferedPerClient == 16 * 1024 * 1024)
    }

    @Test(arguments: [
        ("{ connection_buffer: 8KiB }", "limits.connection_buffer must be between 16KiB and 64MiB"),
        ("{ connection_buffer: 65MiB }", "limits.connection_buffer must be between 16KiB and 64MiB"),
        ("{ connection_buffer: lots }", "limits.connection_buffer: 'lots' is not a size"),
        ("{ max_memory: 512KiB }", "limits.max_memory must be at least 1MiB"),
        ("{ read_ahead: -1 }", "limits.read_ahead: '-1' is not a size"),
        ("{ max_spooled_bytes: 0 }", "limits.max_spooled_bytes: '0' is not a size"),
        (
            "{ max_spooled_bytes: 8MiB, read_ahead: 16MiB }",
            "limits.read_ahead (16MiB) must not be above limits.max_spooled_bytes (8MiB)"
        ),
        (
            "{ max_buffered_bytes: 8MiB, max_buffered_per_client: 9MiB }",
            "limits.max_buffered_per_client (9MiB) must not be above limits.max_buffered_bytes (8MiB)"
        ),
    ])
    func refusals(_ limits: String, _ message: String) {
        let found = errors(Self.yaml(limits)).map(\.message)
        #expect(found.contains { $0.contains(message) }, "\(found)")
    }

    /// Reading ahead (`limits.read_ahead`, `limits.max_spooled_bytes`,
    /// `storage.spool_dir`): defaults, `0` turning it off, the per-client
    /// share, and where the spool goes when the file does not say.
    @Test func readAheadAndTheSpool() throws {
        let c = try ConfigLoader.parse(Self.yaml("{}"), file: "t.yaml")
        #expect(c.limits.readAhead == 16 << 20)
        #expect(c.limits.maxSpooledBytes == 1 << 30)
        #expect(c.limits.spooledPerClient == 128 << 20, "an eighth of max_spooled_bytes")
        #expect(c.limits.bodyInMemory == 64 << 10)
        #expect(c.storage.spoolDir == nil)
        let tmp = ProcessInfo.processInfo.environment["TMPDIR"].flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
        #expect(c.spoolDirectory == tmp, "no route delivers later: the system's temporary directory")
        let off = try ConfigLoader.parse(Self.yaml("{ read_ahead: 0, max_buffered_per_client: 4MiB }"), file: "t.yaml")
        #expect(off.limits.readAhead == 0)
        #expect(off.limits.spooledPerClient == 4 << 20, "max_buffered_per_client, when set, is the spool's share too")
        let set = try ConfigLoader.parse(
            Self.yaml("{ read_ahead: 1MiB, max_spooled_bytes: 64MiB }") + "\nstorage: { spool_dir: /srv/spool }", file: "t.yaml")
        #expect(set.limits.readAhead == 1 << 20 && set.limits.spooledPerClient == 8 << 20)
        #expect(set.spoolDirectory == "/srv/spool")
        let later = try ConfigLoader.parse(
            Self.yaml("{}").replacingOccurrences(of: "upstream: api", with: "upstream: api\n    delivery: { mode: later }")
                + "\nstorage: { path: /var/lib/hp/d.db }", file: "t.yaml")
        #expect(later.spoolDirectory == "/var/lib/hp", "beside the delivery store")
        let relative = errors(Self.yaml("{}") + "\nstorage: { spool_dir: spool }").map(\.message)
        #expect(relative.contains { $0.contains("storage.spool_dir must be an absolute directory path") }, "\(relative)")
    }

    /// `happypath check` on the spool directory: one that is set and missing
    /// is reported; the default beside the store's file is the store's to
    /// make (the example config's /var/lib/happypath need not exist yet);
    /// with nothing ever spooled, none is looked at.
    @Test func theSpoolDirectoryIsChecked() throws {
        let missing = try ConfigLoader.parse(Self.yaml("{}") + "\nstorage: { spool_dir: /nonexistent/happypath }", file: "t.yaml")
        #expect(ConfigLoader.spoolProblem(missing)?.contains("/nonexistent/happypath does not exist") == true)
        let unused = try ConfigLoader.parse(
            Self.yaml("{ read_ahead: 0, body_in_memory: 10MiB }") + "\nstorage: { spool_dir: /nonexistent/happypath }",
            file: "t.yaml")
        #expect(ConfigLoader.spoolProblem(unused) == nil)
        let besideStore = try ConfigLoader.parse(
            Self.yaml("{}").replacingOccurrences(of: "upstream: api", with: "upstream: api\n    delivery: { mode: later }")
                + "\nstorage: { path: /nonexistent/happypath/d.db }", file: "t.yaml")
        #expect(ConfigLoader.spoolProblem(besideStore) == nil)
        #expect(ConfigLoader.spoolProblem(try ConfigLoader.parse(Self.yaml("{}"), file: "t.yaml")) == nil, "the temporary directory")
    }

    @Test(arguments: [(700, "700B"), (1024, "1KiB"), (1536, "1.5KiB"), (256 << 20, "256MiB"), (3 << 30, "3GiB")])
    func sizesReadAsAPersonWritesThem(_ bytes: Int, _ text: String) {
        #expect(Units.sizeText(bytes) == text)
    }
}
