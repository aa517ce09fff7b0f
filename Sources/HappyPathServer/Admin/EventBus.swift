import Foundation
import HappyPathAdmin
import HappyPathCore
import HappyPathIO
import HappyPathPolicies
import Synchronization

/// Every broadcast (breaker changes, parked and replayed commands, token
/// refreshes, reachability) as Server-Sent Events on `GET /admin/events`.
/// Publishing is safe from any thread; delivery runs on the admin loop.
///
/// A subscriber that does not read would keep every event in memory (20
/// of them grew the process by 93 MB over 40,000 events): once more than
/// `maxUnreadBytes` wait for its client, it is dropped (its connection
/// closed) and the others carry on. A client that reads keeps up easily:
/// the bound is thousands of events.
final class EventBus: Sendable {
    let loop: EventLoop
    private let subscribers: LoopBound<[ObjectIdentifier: EventSubscriber]>
    /// The last `StatusPage.eventsShown` events, oldest first, for the
    /// status page (kept on the admin loop, where they are published).
    private let recentEvents: LoopBound<[AdminSnapshot.Event]>
    /// Output waiting for one subscriber's client past which it is dropped.
    static let maxUnreadBytes = 1 << 20
    /// Subscribers dropped for not reading (`happypath_event_subscribers_dropped_total`).
    let dropped = Atomic<Int>(0)

    init(loop: EventLoop) {
        self.loop = loop
        subscribers = LoopBound([:], on: loop)
        recentEvents = LoopBound([], on: loop)
    }

    /// `fields` become the JSON `data` line, after `type` and `ts`.
    func publish(_ type: String, _ fields: [(String, String)] = []) {
        let ts = Timestamp.now()
        var data = "{\"type\":\(JSON.quote(type)),\"ts\":\"\(ts)\""
        for (key, value) in fields {
            data += ",\(JSON.quote(key)):" + (Int(value) != nil ? value : JSON.quote(value))
        }
        data += "}"
        let frame = "event: \(type)\ndata: \(data)\n\n"
        let event: AdminSnapshot.Event = (type, "\(ts)", fields.map { ($0.0, $0.1) })
        let recent = recentEvents
        loop.execute(with: subscribers) { subscribers in
            for subscriber in subscribers.values { subscriber.send(frame) }
            if recent.value.count >= StatusPage.eventsShown { recent.value.removeFirst() }
            recent.value.append(event)
        }
    }

    /// Admin loop: the last events, oldest first.
    var recent: [AdminSnapshot.Event] { recentEvents.value }

    /// Admin loop: keeps `request` open as an event stream.
    func subscribe(_ request: HTTPRequest) {
        let subscriber = EventSubscriber(request: request, bus: self)
        subscribers.value[ObjectIdentifier(subscriber)] = subscriber
        subscriber.start()
    }

    fileprivate func remove(_ subscriber: EventSubscriber) {
        subscribers.value[ObjectIdentifier(subscriber)] = nil
    }

    /// Admin loop: ends every stream (shutdown).
    func closeAll() {
        for s in subscribers.value.values { s.request.endReply() }
        subscribers.value.removeAll()
    }
}

private final class EventSubscriber: HTTPRequestObserver, LoopEventTarget {
    let request: HTTPRequest
    let bus: EventBus
    private var dropped = false

    init(request: HTTPRequest, bus: EventBus) {
        self.request = request
        self.bus = bus
    }

    func start() {
        request.observer = self
        // Cache-Control (no-store) and X-Content-Type-Options: staged by
        // the admin server, as on every admin answer (AdminServer.answerFields).
        request.addResponseHeader("Content-Type", "text/event-stream")
        request.startReply(status: 200)
        send(": happypath events\n\n")
    }

    func send(_ frame: String) {
        guard !dropped else { return }
        var frame = frame
        frame.withUTF8 { request.send(UnsafeRawBufferPointer($0)) }
        if request.pendingOutput > EventBus.maxUnreadBytes { drop() }
    }

    /// Its client stopped reading: the connection closes, and the queued
    /// output goes with it. (`abort` clears the observer first, so no
    /// `requestClientClosed` follows; the bus iterates a copy of its
    /// subscribers, so this one may leave it now.)
    private func drop() {
        dropped = true
        bus.dropped.wrappingAdd(1, ordering: .relaxed)
        request.abort()
        bus.remove(self)
    }

    func requestClientClosed(_ request: HTTPRequest) {
        // Possibly inside a write: finish on the next pass.
        let event = bus.loop.takeEvent(target: self)
        event.arm(after: .zero)
    }

    func loopEventFired(_ event: LoopEvent) {
        event.recycle()
        request.abort()
        bus.remove(self)
    }

    func requestOutputDrained(_ request: HTTPRequest) {}
}
