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
        (
            "{ max_buffered_bytes: 8MiB, max_buffered_per_client: 9MiB }",
            "limits.max_buffered_per_client (9MiB) must not be above limits.max_buffered_bytes (8MiB)"
        ),
    ])
    func refusals(_ limits: String, _ message: String) {
        let found = errors(Self.yaml(limits)).map(\.message)
        #expect(found.contains { $0.contains(message) }, "\(found)")
    }

    @Test(arguments: [(700, "700B"), (1024, "1KiB"), (1536, "1.5KiB"), (256 << 20, "256MiB"), (3 << 30, "3GiB")])
    func sizesReadAsAPersonWritesThem(_ bytes: Int, _ text: String) {
        #expect(Units.sizeText(bytes) == text)
    }
}
