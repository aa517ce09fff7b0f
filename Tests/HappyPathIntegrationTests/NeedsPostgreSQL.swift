import PostgresTestServer
import Testing

extension Trait where Self == ConditionTrait {
    /// On a suite or test that needs a PostgreSQL server: skipped, with the
    /// reason, when there is none (`PostgresServer.skipReason`).
    static var needsPostgreSQL: Self {
        .enabled(if: PostgresServer.skipReason == nil, Comment(rawValue: PostgresServer.skipReason ?? ""))
    }
}
