import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The test support's own promises, checked on the machine that runs the tests.
@Suite("test support") struct TestSupportTests {
    /// connect() to 127.0.0.1:`port`: 0, or the errno.
    func connectErrno(_ port: Int) -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return rc == 0 ? 0 : errno
    }

    @Test func aRefusingPortRefusesConnectionsAndCannotBeTaken() {
        let refusing = RefusingPort()
        for _ in 0..<3 { #expect(connectErrno(refusing.port) == ECONNREFUSED) }
        // Nobody else can bind it meanwhile, even with SO_REUSEADDR.
        let other = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(other) }
        var one: Int32 = 1
        setsockopt(other, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(refusing.port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let failure = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(other, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 ? 0 : errno
            }
        }
        #expect(failure == EADDRINUSE)
        withExtendedLifetime(refusing) {}
    }

    @Test func aRefusingPortCanComeUp() throws {
        let refusing = RefusingPort()
        let port = refusing.port
        #expect(connectErrno(port) == ECONNREFUSED)
        let up = ScriptedUpstream(comingUpOn: refusing) { _ in http(200, "up") }.started()
        defer { up.stop() }
        #expect(try HTTP.request(port: port, "/").text == "up")
    }
}
