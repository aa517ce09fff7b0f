import Foundation
import HappyPathCore
import HappyPathIO

/// Every broadcast (breaker changes, parked and replayed commands, token
/// refreshes, reachability) as Server-Sent Events on `GET /admin/events`.
/// Publishing is safe from any thread; delivery runs on the admin loop.
final class EventBus: Sendable {
    let loop: EventLoop
    private let subscribers: LoopBound<[ObjectIdentifier: EventSubscriber]>

    init(loop: EventLoop) {
        self.loop = loop
        subscribers = LoopBound([:], on: loop)
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
        loop.execute(with: subscribers) { subscribers in
            for subscriber in subscribers.values { subscriber.send(frame) }
        }
    }

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

    init(request: HTTPRequest, bus: EventBus) {
        self.request = request
        self.bus = bus
    }

    func start() {
        request.observer = self
        request.addResponseHeader("Content-Type", "text/event-stream")
        request.addResponseHeader("Cache-Control", "no-cache")
        request.startReply(status: 200)
        send(": happypath events\n\n")
    }

    func send(_ frame: String) {
        var frame = frame
        frame.withUTF8 { request.send(UnsafeRawBufferPointer($0)) }
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
