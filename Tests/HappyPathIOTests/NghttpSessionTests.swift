import CNghttp2
import Testing

/// libnghttp2 through the `CNghttp2` module, with no socket: a client
/// session and a server session hand each other their bytes in memory, the
/// way `HTTP2Session` is meant to be tested (docs/plans/http2.md, section 3).
@Suite struct NghttpSessionTests {
    /// The frames one session received, in order. The session's `user_data`
    /// is this object, passed unretained: the test holds it for as long as
    /// the session lives.
    final class FrameLog {
        var frames: [(type: UInt8, flags: UInt8)] = []
    }

    /// One session and its log; the callbacks object is freed once the
    /// session is made (nghttp2 copies it).
    final class Peer {
        let log = FrameLog()
        var session: OpaquePointer?

        init(server: Bool) throws {
            var callbacks: OpaquePointer?
            try #require(nghttp2_session_callbacks_new(&callbacks) == 0)
            defer { nghttp2_session_callbacks_del(callbacks) }
            nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, userData in
                guard let frame, let userData else { return 0 }
                let log = Unmanaged<FrameLog>.fromOpaque(userData).takeUnretainedValue()
                log.frames.append((frame.pointee.hd.type, frame.pointee.hd.flags))
                return 0
            }
            let userData = Unmanaged.passUnretained(log).toOpaque()
            let rv =
                server
                ? nghttp2_session_server_new(&session, callbacks, userData)
                : nghttp2_session_client_new(&session, callbacks, userData)
            try #require(rv == 0)
        }

        deinit { nghttp2_session_del(session) }

        func submitSettings(maxConcurrentStreams: UInt32) -> Int32 {
            var entries = [
                nghttp2_settings_entry(
                    settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: maxConcurrentStreams)
            ]
            return nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count)
        }

        /// Everything the session has to send (`nghttpOutput`).
        func output() -> [UInt8] { nghttpOutput(session) }

        /// `mem_recv` over all of `bytes`: the count consumed, or a negative error.
        func input(_ bytes: [UInt8]) -> Int { nghttpInput(session, bytes) }
    }

    static let settings = UInt8(NGHTTP2_SETTINGS.rawValue)
    static let ack = UInt8(NGHTTP2_FLAG_ACK.rawValue)

    @Test func theClientPrefaceAndSettingsReachTheServer() throws {
        let client = try Peer(server: false)
        let server = try Peer(server: true)
        #expect(client.submitSettings(maxConcurrentStreams: 7) == 0)
        #expect(server.submitSettings(maxConcurrentStreams: 100) == 0)

        let fromClient = client.output()
        // The connection preface: the 24-byte magic, then a SETTINGS frame (RFC 9113 section 3.4).
        let magic = Array(NGHTTP2_CLIENT_MAGIC.utf8)
        #expect(magic.count == Int(NGHTTP2_CLIENT_MAGIC_LEN))
        #expect(Array(fromClient.prefix(magic.count)) == magic)
        #expect(fromClient.count > magic.count + 9)
        #expect(fromClient[magic.count + 3] == Self.settings)

        #expect(server.input(fromClient) == fromClient.count)
        #expect(server.log.frames.map(\.type) == [Self.settings])
        let remote = nghttp2_session_get_remote_settings(server.session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
        #expect(remote == 7)

        // The server's SETTINGS and its ACK of the client's go back.
        let fromServer = server.output()
        #expect(client.input(fromServer) == fromServer.count)
        #expect(client.log.frames.map(\.type) == [Self.settings, Self.settings])
        #expect(client.log.frames.map { $0.flags & Self.ack } == [0, Self.ack])
        #expect(nghttp2_session_get_remote_settings(client.session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS) == 100)

        // And the client's ACK of the server's settings.
        let ackFromClient = client.output()
        #expect(server.input(ackFromClient) == ackFromClient.count)
        #expect(server.log.frames.map { $0.flags & Self.ack } == [0, Self.ack])
        #expect(nghttp2_session_want_read(server.session) != 0)
    }

    @Test func http11BytesAreNotAClientPreface() throws {
        // Why a cleartext listener sniffs before it makes a session (HTTP2Preface).
        let server = try Peer(server: true)
        let request = Array("GET / HTTP/1.1\r\nHost: a\r\n\r\n".utf8)
        #expect(server.input(request) == Int(NGHTTP2_ERR_BAD_CLIENT_MAGIC.rawValue))
    }

    @Test func theSessionsAreTheVersionThePlanWasProbedOn() throws {
        // 1.52.0 (0x013400) or later: deb12u3 carries the Rapid Reset and
        // CONTINUATION limits; the version number does not show the Debian revision.
        let info = try #require(nghttp2_version(0))
        #expect(info.pointee.version_num >= 0x01_34_00)
        #expect(String(cString: info.pointee.proto_str) == "h2")
    }
}
