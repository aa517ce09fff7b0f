import Foundation
import Synchronization

/// Clients that each make one request after another (a fresh connection
/// each, as a crowd of real clients would) until told to stop, counting
/// what they got: the load of the overload attacks (issue 44). A request
/// that fails at the socket (refused, timed out) counts as `failed`.
final class Crowd: Sendable {
    let answered = Atomic<Int>(0)
    let overloaded = Atomic<Int>(0)
    let failed = Atomic<Int>(0)
    private let stopping = Atomic<Bool>(false)
    private let running = Atomic<Int>(0)

    /// `clients` threads on `target`; `source` picks the loopback address
    /// they come from (another address is another client to the proxy);
    /// `read` reads each answer (default: the whole response).
    init(
        port: Int, clients: Int, target: String, headers: [(String, String)] = [], source: String? = nil,
        timeout: Double = 12, read: (@Sendable (TestConnection) throws -> Int)? = nil
    ) {
        running.store(clients, ordering: .relaxed)
        for _ in 0..<clients {
            let thread = Thread { [self] in
                while !stopping.load(ordering: .relaxed) {
                    do {
                        let c = try TestConnection(port: port, timeout: timeout, source: source)
                        var head = "GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        for (name, value) in headers { head += "\(name): \(value)\r\n" }
                        try c.send(head + "\r\n")
                        let status = try read?(c) ?? c.readResponse().status
                        if status == 200 {
                            answered.add(1, ordering: .relaxed)
                        } else if status == 503 {
                            overloaded.add(1, ordering: .relaxed)
                        } else {
                            failed.add(1, ordering: .relaxed)
                        }
                    } catch {
                        failed.add(1, ordering: .relaxed)
                    }
                }
                running.subtract(1, ordering: .relaxed)
            }
            thread.stackSize = 256 << 10
            thread.start()
        }
    }

    /// Requests that got an answer of any kind (or failed).
    var total: Int {
        answered.load(ordering: .relaxed) + overloaded.load(ordering: .relaxed) + failed.load(ordering: .relaxed)
    }

    /// The share answered 200, in percent.
    var availability: Double { total == 0 ? 0 : Double(answered.load(ordering: .relaxed)) * 100 / Double(total) }

    var summary: String {
        "\(answered.load(ordering: .relaxed)) answered, \(overloaded.load(ordering: .relaxed)) 503, "
            + "\(failed.load(ordering: .relaxed)) other of \(total)"
    }

    /// Stops after each client's request in progress, and waits for them.
    func stop() {
        stopping.store(true, ordering: .relaxed)
        while running.load(ordering: .relaxed) > 0 { Thread.sleep(forTimeInterval: 0.01) }
    }
}
