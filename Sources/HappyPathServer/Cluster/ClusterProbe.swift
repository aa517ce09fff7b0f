import Foundation
import HappyPathConfig
import HappyPathCore
import HappyPathIO
import HappyPathPolicies

/// `happypath check --connect`: opens the cluster link once, as a worker
/// would (connect, TLS, AUTH, SELECT, SCRIPT LOAD), and says what failed in
/// words, never with the password.
public enum ClusterProbe {
    /// Nil when Redis took the greeting; else what went wrong, and what to check.
    public static func problem(_ settings: ClusterConfiguration, within limit: Duration = .seconds(5)) -> String? {
        EventLoop.initializeLibraries()
        let loop = EventLoop()
        let outcome = Outcome()
        let clock = MonotonicClock()
        let tls = settings.tls.map { UpstreamTLS(ca: $0.ca, verify: $0.verify, clientCert: nil, clientKey: nil) }
        let endpoint = settings.redis
        // The probe waits longer than a request would: it is a person asking.
        let timeout = max(settings.timeout, .seconds(2))
        loop.execute {
            do {
                let connection = try RedisConnection(
                    loop: loop, endpoint: endpoint, timeout: timeout, retry: .seconds(60), clock: { clock.now() },
                    greeting: [["SCRIPT", "LOAD", ClusterScript.gcra]], tls: tls)
                connection.delegate = outcome
                outcome.connection = connection
                connection.start()
            } catch {
                outcome.finish("\(error)")
            }
        }
        loop.start(name: "redis-probe")
        let answered = outcome.done.wait(timeout: .now() + limit.seconds) == .success
        // Closed on the loop before it stops: a `stop` that came first
        // would skip the close, and the connection's events would outlive it.
        let closed = DispatchSemaphore(value: 0)
        loop.execute {
            outcome.connection?.close()
            outcome.connection = nil
            closed.signal()
        }
        _ = closed.wait(timeout: .now() + 5)
        loop.stop()
        loop.join()
        loop.close()
        guard answered else { return "\(endpoint.address): no answer within \(limit.configText)" }
        return outcome.problem
    }

    /// On the probe's loop until `done` is signalled.
    private final class Outcome: RedisConnectionDelegate, @unchecked Sendable {
        let done = DispatchSemaphore(value: 0)
        var connection: RedisConnection?
        private(set) var problem: String?
        private var finished = false

        func finish(_ problem: String?) {
            guard !finished else { return }
            finished = true
            self.problem = problem
            done.signal()
        }

        func redisUp(_ connection: RedisConnection, restored: Bool) { finish(nil) }

        func redisDown(_ connection: RedisConnection, reason: String) {
            let auth = reason.contains("WRONGPASS") || reason.contains("NOAUTH")
            finish(auth ? "\(reason) (check the password in cluster.redis.url)" : reason)
        }

        func redisMessage(_ connection: RedisConnection, channel: String, payload: [UInt8]) {}
    }
}
