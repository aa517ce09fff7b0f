import HappyPathCore
import Testing

/// What makes a request a gRPC call, what an answer's `grpc-status` says,
/// and the bounded `grpc_status` label.
@Suite struct GRPCCallTests {
    @Test(arguments: [
        ("application/grpc", true), ("application/grpc+proto", true), ("application/grpc+json", true),
        ("application/grpc;charset=utf-8", true), ("Application/GRPC", true), ("application/grpc-web", false),
        ("application/grpc-web+proto", false), ("application/grpcx", false), ("application/json", false),
        ("application/grp", false), ("", false), ("text/plain", false), ("Application/GRPC;charset=x", true),
    ])
    func aGRPCContentTypeIsApplicationGrpcAloneOrWithACodecOrParameters(_ value: String, _ expected: Bool) {
        #expect(Array(value.utf8).withUnsafeBytes { GRPCCall.isContentType($0) } == expected)
    }

    @Test(arguments: [
        ("0", GRPCStatusField.status(.ok)), ("14", .status(.unavailable)), ("16", .status(.unauthenticated)),
        ("17", .unrecognized), ("999", .unrecognized), ("1000", .unrecognized), ("", .unrecognized),
        ("-1", .unrecognized), ("1 ", .unrecognized), ("99999999999999999999", .unrecognized),
    ])
    func aReceivedGrpcStatusIsReadBounded(_ value: String, _ expected: GRPCStatusField) {
        #expect(Array(value.utf8).withUnsafeBytes { GRPCStatusField(value: $0) } == expected)
    }

    @Test(arguments: [
        (GRPCStatusField.status(.notFound), 200, GRPCStatus?.some(.notFound)),
        (.status(.unavailable), 503, .unavailable),
        (.absent, 200, .unknown), (.absent, 503, .unavailable), (.absent, 404, .unimplemented),
        (.unrecognized, 200, nil),
    ])
    func theClientsStatusIsTheFieldsElseGRPCsHTTPTable(_ field: GRPCStatusField, _ http: Int, _ expected: GRPCStatus?) {
        #expect(field.clientStatus(httpStatus: http) == expected)
    }

    @Test func theLabelHasEighteenValues() {
        let labels = Set(GRPCStatus.allCases.map { GRPCCall.label($0) } + [GRPCCall.label(nil)])
        #expect(labels.count == 18)
        #expect(GRPCCall.label(.unavailable) == "14" && GRPCCall.label(.ok) == "0" && GRPCCall.label(nil) == "unknown")
    }
}
