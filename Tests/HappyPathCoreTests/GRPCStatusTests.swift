import Foundation
import Testing

@testable import HappyPathCore

/// gRPC's status codes, their names, and the tables that map the proxy's
/// problems and plain HTTP statuses onto them (docs/grpc.md).
@Suite struct GRPCStatusTests {
    static let codes: [(GRPCStatus, Int, String, String)] = [
        (.ok, 0, "OK", "ok"),
        (.cancelled, 1, "CANCELLED", "cancelled"),
        (.unknown, 2, "UNKNOWN", "unknown"),
        (.invalidArgument, 3, "INVALID_ARGUMENT", "invalid-argument"),
        (.deadlineExceeded, 4, "DEADLINE_EXCEEDED", "deadline-exceeded"),
        (.notFound, 5, "NOT_FOUND", "not-found"),
        (.alreadyExists, 6, "ALREADY_EXISTS", "already-exists"),
        (.permissionDenied, 7, "PERMISSION_DENIED", "permission-denied"),
        (.resourceExhausted, 8, "RESOURCE_EXHAUSTED", "resource-exhausted"),
        (.failedPrecondition, 9, "FAILED_PRECONDITION", "failed-precondition"),
        (.aborted, 10, "ABORTED", "aborted"),
        (.outOfRange, 11, "OUT_OF_RANGE", "out-of-range"),
        (.unimplemented, 12, "UNIMPLEMENTED", "unimplemented"),
        (.internal, 13, "INTERNAL", "internal"),
        (.unavailable, 14, "UNAVAILABLE", "unavailable"),
        (.dataLoss, 15, "DATA_LOSS", "data-loss"),
        (.unauthenticated, 16, "UNAUTHENTICATED", "unauthenticated"),
    ]

    @Test(arguments: codes)
    func eachCodeHasItsNumberAndNames(_ status: GRPCStatus, number: Int, name: String, configName: String) {
        #expect(status.rawValue == number)
        #expect(status.name == name)
        #expect(status.configName == configName)
        #expect(GRPCStatus(configName: configName) == status)
        #expect(status.fieldValue == String(number))
        #expect(GRPCStatus(fieldValue: String(number)) == status)
    }

    @Test func thereAreSeventeenCodes() {
        #expect(GRPCStatus.allCases.count == 17)
        #expect(Set(GRPCStatus.allCases.map(\.configName)).count == 17)
    }

    @Test(arguments: ["", "Unavailable", "UNAVAILABLE", "deadline_exceeded", " unavailable", "unavailable ", "14", "deadline"])
    func aConfigNameIsSpelledExactly(_ text: String) {
        #expect(GRPCStatus(configName: text) == nil)
    }

    @Test(arguments: ["", "17", "99", "-1", "+1", " 1", "1 ", "1a", "0x1", "0014", "99999999999999999999999", "١٤"])
    func aGrpcStatusFieldOutsideTheCodesIsNone(_ text: String) {
        #expect(GRPCStatus(fieldValue: text) == nil)
    }

    @Test func leadingZerosWithinThreeDigitsAreStillTheCode() {
        // Not what a peer should send, but nothing to refuse a call over.
        #expect(GRPCStatus(fieldValue: "014") == .unavailable)
        #expect(GRPCStatus(fieldValue: "00") == .ok)
    }

    // MARK: - HTTP status → gRPC (grpc/grpc doc/http-grpc-status-mapping.md)

    @Test(arguments: [
        (400, GRPCStatus.internal), (401, .unauthenticated), (403, .permissionDenied), (404, .unimplemented),
        (429, .unavailable), (431, .internal), (502, .unavailable), (503, .unavailable), (504, .unavailable),
        (200, .unknown), (204, .unknown), (301, .unknown), (405, .unknown), (408, .unknown), (413, .unknown),
        (500, .unknown), (501, .unknown), (0, .unknown), (-1, .unknown), (Int.max, .unknown),
    ])
    func anHTTPStatusWithoutGrpcStatusMapsAsGRPCsTableSays(_ http: Int, _ expected: GRPCStatus) {
        #expect(GRPCStatus(httpStatus: http) == expected)
    }

    // MARK: - The proxy's problems → gRPC (issue 34's table)

    @Test(arguments: [
        (ProblemCode.upstreamUnreachable, GRPCStatus.unavailable),
        (.upstreamUnavailable, .unavailable),
        (.circuitOpen, .unavailable),
        (.overloaded, .unavailable),
        (.upstreamPaused, .unavailable),
        (.upstreamTimeout, .deadlineExceeded),
        (.rateLimited, .resourceExhausted),
        (.payloadTooLarge, .resourceExhausted),
        (.noRoute, .unimplemented),
        (.authFailed, .unauthenticated),
        (.forbidden, .permissionDenied),
        // The rest by their HTTP status, through gRPC's table.
        (.badRequest, .internal),  // 400
        (.headersTooLarge, .internal),  // 431
        (.notFound, .unimplemented),  // 404
        (.clientError, .internal),  // 400
        (.badGateway, .unavailable),  // 502
        (.upstreamTLS, .unavailable),  // 502
        (.storeUnavailable, .unavailable),  // 503
        (.uriTooLong, .unknown),  // 414
        (.requestTimeout, .unknown),  // 408
        (.notImplemented, .unknown),  // 501
        (.versionNotSupported, .unknown),  // 505
        (.methodNotAllowed, .unknown),  // 405
        (.idempotencyKeyReused, .unknown),  // 422
    ])
    func eachProblemCodeHasItsGRPCStatus(_ code: ProblemCode, _ expected: GRPCStatus) {
        #expect(code.grpcStatus == expected)
        #expect(GRPCStatus(problemCode: code.rawValue, httpStatus: code.status) == expected)
    }

    @Test func everyProblemCodeIsInTheTable() {
        // The table above names all of them; a new code must be added there (and to docs/grpc.md).
        #expect(ProblemCode.allCases.count == 24)
    }

    @Test func aRoutesOwnCodeMapsByItsHTTPStatus() {
        #expect(GRPCStatus(problemCode: "QUOTA_GONE", httpStatus: 429) == .unavailable)
        #expect(GRPCStatus(problemCode: "ORDER_MISSING", httpStatus: 404) == .unimplemented)
        #expect(GRPCStatus(problemCode: "TEAPOT", httpStatus: 418) == .unknown)
    }

    // MARK: - docs/grpc.md says the same

    @Test func theDocsTablesAreTheCode() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let docs = try String(contentsOf: root.appendingPathComponent("docs/grpc.md"), encoding: .utf8)
        func cells(_ line: Substring) -> [String] {
            line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
        }
        func firstQuoted(_ cell: String) -> String? {
            cell.split(separator: "`", omittingEmptySubsequences: false).dropFirst().first.map(String.init)
        }
        var problemRows = Set<ProblemCode>()
        var httpRows = Set<Int>()
        for line in docs.split(separator: "\n") where line.hasPrefix("| ") {
            let row = cells(line)
            if row.count == 4, let code = firstQuoted(row[0]).flatMap(ProblemCode.init(rawValue:)) {
                #expect(firstQuoted(row[2]) == code.grpcStatus.name, "\(code)")
                #expect(Int(row[3]) == code.grpcStatus.rawValue, "\(code)")
                #expect(Int(row[1]) == code.status, "\(code)")
                problemRows.insert(code)
            } else if row.count == 2, let http = Int(row[0].prefix(3)) {
                #expect(firstQuoted(row[1]) == GRPCStatus(httpStatus: http).name, "HTTP \(http)")
                httpRows.insert(http)
            }
        }
        #expect(problemRows == Set(ProblemCode.allCases))
        #expect(httpRows == [400, 401, 403, 404, 429, 431, 502, 503, 504])
    }
}
