#if canImport(Glibc)
    import Glibc
#endif

/// Socket addresses as text.
enum SocketAddress {
    static func text(of address: sockaddr_storage) -> String {
        var storage = address
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        let family = Int32(storage.ss_family)
        withUnsafeMutableBytes(of: &storage) { raw in
            // sin6_addr sits at offset 8, sin_addr at offset 4.
            let offset = family == AF_INET6 ? 8 : 4
            _ = inet_ntop(family == AF_INET6 ? AF_INET6 : AF_INET, raw.baseAddress! + offset, &text, socklen_t(text.count))
        }
        return String(nulTerminated: text)
    }

    /// The local address of `fd` (`getsockname`), or "" if it cannot be read.
    static func local(of fd: Int32) -> String {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return rc == 0 ? text(of: storage) : ""
    }
}

/// A connection's two addresses as text, each made the first time it is asked for.
struct ConnectionAddresses {
    let peer: sockaddr_storage
    private var peerText: String?
    private var localText: String?

    init(peer: sockaddr_storage) { self.peer = peer }

    mutating func peerAddress() -> String {
        if let peerText { return peerText }
        peerText = SocketAddress.text(of: peer)
        return peerText!
    }

    /// Where the connection arrived (`getsockname` on `fd`): the listener's
    /// own address, or for a listener on `0.0.0.0` or `::` the interface
    /// address the client reached. Empty if it cannot be read.
    mutating func localAddress(of fd: Int32) -> String {
        if let localText { return localText }
        localText = SocketAddress.local(of: fd)
        return localText!
    }
}

extension String {
    /// The text of a C buffer, up to its first NUL.
    init(nulTerminated buffer: [CChar]) {
        self.init(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
