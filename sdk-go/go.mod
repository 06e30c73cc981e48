module agentreach.dev/sdk-go

go 1.22
