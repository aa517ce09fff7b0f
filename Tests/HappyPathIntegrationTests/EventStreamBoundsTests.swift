import Foundation
import Synchronization
import Testing

@testable import HappyPathServer

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 30, section 3: an `/admin/events` subscriber that stops reading
/// is dropped once its unread output passes a bound, and the others keep
/// receiving.
@Suite("event stream bounds") struct EventStreamBoundsTests {
    /// A subscriber that never reads used to keep every event in memory
    /// for the hour its connection was allowed to stall (20 of them: 93 MB
    /// over 40,000 events). Past `EventBus.maxUnreadBytes` it is dropped;
    /// a subscriber that reads keeps receiving.
    @Test func aSubscriberThatNeverReadsIsDroppedWhileAReaderKeepsReceiving() throws {
        let h = try ProxyHarness()
        defer { h.stop() }
        let bus = try #require(h.proxy.events)
        let admin = AdminProbe(port: h.adminPort)
        let reader = try EventReader(TestConnection(port: h.adminPort, timeout: 10))
        // A small receive buffer: what the kernel holds for it is small too.
        let idle = try TestConnection(port: h.adminPort, timeout: 10, receiveBuffer: 4096)
        try idle.send("GET /admin/events HTTP/1.1\r\nHost: 127.0.0.1:\(h.adminPort)\r\n\r\n")
        // Subscribed: the stream's opening comment arrived (and then it stops reading).
        var opening: [UInt8] = []
        while !String(decoding: opening, as: UTF8.self).contains(": happypath events") {
            opening += try Edge.readRaw(idle, 1)
        }
        #expect(reader.waitForOpening())

        // Events of about 1 KiB, 64 at a time; the reader reads each batch
        // before the next is published, so only the idle subscriber falls behind.
        let padding = String(repeating: "x", count: 1000)
        var published = 0
        var dropped = false
        while published < 64 * 1024 {  // 64 MiB: far past any bound
            for _ in 0..<64 {
                published += 1
                bus.publish("test_flood", [("n", "\(published)"), ("pad", padding)])
            }
            guard waitUntil("the reader to have event \(published)", { reader.last.load(ordering: .acquiring) == published })
            else { break }
            // (Its end of the connection shows no hang-up: the close waits
            // behind the bytes its client does not read. The count says.)
            if try admin.metric("happypath_event_subscribers_dropped_total") >= 1 {
                dropped = true
                break
            }
        }
        #expect(dropped, "the idle subscriber was still open after \(published) events")
        // The idle subscriber's connection ends (after what the kernel held for it).
        #expect(Edge.readToEnd(idle) != nil)
        // The reader keeps receiving.
        published += 1
        bus.publish("test_flood", [("n", "\(published)")])
        #expect(waitUntil("the reader to have the last event") { reader.last.load(ordering: .acquiring) == published })
        // One dropped: the reader never was.
        #expect(try admin.metric("happypath_event_subscribers_dropped_total") == 1)
    }
}

/// An `/admin/events` subscriber reading on a thread of its own: the
/// highest `"n"` it has seen in a `data:` line. (Unchecked: after `init`
/// only its thread reads the connection; the rest are atomics.)
private final class EventReader: @unchecked Sendable {
    let last = Atomic<Int>(0)
    let opened = Atomic<Bool>(false)
    private let connection: TestConnection

    init(_ connection: TestConnection) throws {
        self.connection = connection
        try connection.send("GET /admin/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        Thread { [self] in
            let fd = self.connection.fd
            var pending: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 { return }
                pending += chunk[0..<n]
                // Whole lines only; a frame's `data:` line is written in one piece.
                guard let end = pending.lastIndex(of: 0x0A) else { continue }
                for line in pending[...end].split(separator: 0x0A) {
                    let text = String(decoding: line, as: UTF8.self)
                    if text.hasPrefix(": happypath events") { opened.store(true, ordering: .releasing) }
                    guard text.hasPrefix("data: "), let r = text.range(of: "\"n\":") else { continue }
                    let digits = text[r.upperBound...].prefix { $0.isNumber }
                    if let value = Int(digits) { last.store(value, ordering: .releasing) }
                }
                pending.removeFirst(end + 1)
            }
        }.start()
    }

    func waitForOpening() -> Bool {
        waitUntil("the reader's stream to open") { opened.load(ordering: .acquiring) }
    }
}
