#if canImport(Glibc)
    import Glibc
#endif

/// A connection's bytes for the client that the kernel has not taken yet.
/// A write goes straight to the socket (one `writev`) when nothing waits;
/// what the kernel does not take is queued, in order, for `flush`.
struct OutputQueue {
    private var buffer = ByteBuffer(capacity: 1024)
    /// Bytes of `buffer` already written.
    private var sent = 0

    var pending: Int { buffer.count - sent }

    func deallocate() { buffer.deallocate() }

    enum WriteResult { case written, queued, failed }

    /// Writes `pieces` after anything queued: `.queued` when some of them
    /// wait (the caller watches the socket), `.failed` when the peer is gone.
    mutating func write(_ pieces: [UnsafeRawBufferPointer], to fd: Int32, tls: TLSSession?) -> WriteResult {
        if let tls { return write(pieces, tls: tls) }
        var total = 0
        for p in pieces { total += p.count }
        guard total > 0 else { return .written }
        let wasEmpty = buffer.count == sent
        var written = 0
        if wasEmpty {
            written = withUnsafeTemporaryAllocation(of: iovec.self, capacity: pieces.count) { iov in
                var k = 0
                for p in pieces where p.count > 0 {
                    iov[k] = iovec(iov_base: UnsafeMutableRawPointer(mutating: p.baseAddress), iov_len: p.count)
                    k += 1
                }
                return writev(fd, iov.baseAddress, Int32(k))
            }
            if written < 0 {
                if errno != EAGAIN && errno != EINTR { return .failed }
                written = 0
            }
            if written == total { return .written }
            buffer.count = 0
            sent = 0
        }
        // Queue the rest, skipping what was written.
        var skip = written
        for p in pieces {
            if skip >= p.count {
                skip -= p.count
                continue
            }
            buffer.append(UnsafeRawBufferPointer(rebasing: p[skip...]))
            skip = 0
        }
        compact()
        return .queued
    }

    enum FlushResult { case drained, progressed, again, failed }

    /// Through TLS: the pieces are gathered in the queue (one record for
    /// them all, not one per piece), then written as far as the session takes them.
    private mutating func write(_ pieces: [UnsafeRawBufferPointer], tls: TLSSession) -> WriteResult {
        if buffer.count == sent {
            buffer.count = 0
            sent = 0
        }
        for p in pieces where p.count > 0 { buffer.append(p) }
        compact()
        switch flush(to: -1, tls: tls) {
        case .drained: return .written
        case .progressed, .again: return .queued
        case .failed: return .failed
        }
    }

    /// Drops the bytes already written once they outweigh those waiting: a
    /// queue that never quite empties (a tunnel toward a slightly slower
    /// client) stays the size of what waits, not of all that passed. (The
    /// TLS sessions allow a moved buffer between tries.)
    private mutating func compact() {
        guard sent >= 64 * 1024, sent >= buffer.count - sent else { return }
        buffer.removeFirst(sent)
        sent = 0
    }

    /// Writes what is queued, as far as the kernel (or the TLS session) takes it.
    mutating func flush(to fd: Int32, tls: TLSSession?) -> FlushResult {
        var progressed = false
        while buffer.count > sent {
            let n =
                tls?.write(buffer.base + sent, buffer.count - sent) ?? Glibc.write(fd, buffer.base + sent, buffer.count - sent)
            if n <= 0 {
                guard n < 0, errno == EAGAIN || errno == EINTR else { return .failed }
                if progressed { compact() }
                return progressed ? .progressed : .again
            }
            sent += n
            progressed = true
            // A plain socket that took less is full; a TLS session writes record by record.
            if tls == nil, buffer.count > sent {
                compact()
                return .progressed
            }
        }
        buffer.count = 0
        sent = 0
        buffer.shrink(to: 64 * 1024)
        return .drained
    }
}

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
