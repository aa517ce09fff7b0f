/// A value that belongs to one event loop and may be carried through other
/// threads, but read or changed only on its loop's thread: a worker handed
/// a job from the signal thread, a request that waits for the store's
/// reader thread and is answered back on its own loop.
///
/// `LoopBound` is `Sendable` whatever `Value` is; what makes that true is
/// the check on every access (`EventLoop.preconditionInEventLoop`), which
/// stops the process at the first access from the wrong thread, in release
/// builds too (as swift-nio's `NIOLoopBound`): a thread identity compare,
/// a few instructions (docs/performance.md). Copies share one value (it
/// lives in a box), so a change made through one is seen through all of them.
///
/// Made on the loop's thread (or while the loop is not running, when
/// setting it up) with `init(_:on:)`; a value made elsewhere that nothing
/// else refers to is handed over with `init(handing:to:)`.
public struct LoopBound<Value>: @unchecked Sendable {
    @usableFromInline
    final class Box {
        @usableFromInline var value: Value
        @usableFromInline init(_ value: Value) { self.value = value }
    }

    public let loop: EventLoop
    @usableFromInline let box: Box

    /// On `loop`'s thread, or before it runs.
    public init(_ value: Value, on loop: EventLoop) {
        loop.preconditionInEventLoop()
        self.loop = loop
        box = Box(value)
    }

    /// From any thread: `value` is given away (the compiler checks that the
    /// caller keeps no other way to reach it).
    public init(handing value: sending Value, to loop: EventLoop) {
        self.loop = loop
        box = Box(value)
    }

    /// Only on `loop`'s thread.
    @inlinable
    public var value: Value {
        get {
            loop.preconditionInEventLoop()
            return box.value
        }
        nonmutating _modify {
            loop.preconditionInEventLoop()
            yield &box.value
        }
        nonmutating set {
            loop.preconditionInEventLoop()
            box.value = newValue
        }
    }
}

extension EventLoop {
    /// Runs `body` on this loop with the value `bound` holds; safe from any thread.
    public func execute<Value>(with bound: LoopBound<Value>, _ body: @escaping @Sendable (Value) -> Void) {
        precondition(bound.loop === self, "a value bound to another loop")
        execute { body(bound.value) }
    }
}
