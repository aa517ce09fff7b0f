import HappyPathCore

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
    /// Where the process counts queued output (nil: not counted).
    var pool: MemoryPool?

    var pending: Int { buffer.count - sent }

    /// Frees the queue; what it held leaves the pool.
    mutating func deallocate() {
        pool?.add(-pending)
        sent = buffer.count
        buffer.deallocate()
    }

    enum WriteResult { case written, queued, failed }

    /// Writes `pieces` after anything queued: `.queued` when some of them
    /// wait (the caller watches the socket), `.failed` when the peer is gone.
    mutating func write(_ pieces: [UnsafeRawBufferPointer], to fd: Int32, tls: TLSSession?) -> WriteResult {
        let before = pending
        defer { pool?.add(pending - before) }  // what stays queued, counted (nothing, usually)
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
        switch flushQueued(tls: tls) {
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
        let before = pending
        defer { pool?.add(pending - before) }
        return flushQueued(to: fd, tls: tls)
    }

    /// `flush` without the pool's count (the caller counts: a write through TLS).
    private mutating func flushQueued(to fd: Int32 = -1, tls: TLSSession?) -> FlushResult {
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
