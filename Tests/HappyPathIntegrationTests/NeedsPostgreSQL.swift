import PostgresTestServer
import RedisTestServer
import Testing

extension Trait where Self == ConditionTrait {
    /// On a suite or test that needs a PostgreSQL server: skipped, with the
    /// reason, when there is none (`PostgresServer.skipReason`).
    static var needsPostgreSQL: Self {
        .enabled(if: PostgresServer.skipReason == nil, Comment(rawValue: PostgresServer.skipReason ?? ""))
    }
}

extension Trait where Self == ConditionTrait {
    /// On a suite or test that needs a redis-server: skipped, with the
    /// reason, when there is none (`RedisServer.skipReason`).
    static var needsRedis: Self {
        .enabled(if: RedisServer.skipReason == nil, Comment(rawValue: RedisServer.skipReason ?? ""))
    }
}
