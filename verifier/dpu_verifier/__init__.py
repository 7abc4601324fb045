"""The verifier: checks that a pod's cap held, judged on counts the operator's DPUs cannot change, and
signs what it found as evidence anyone can check offline."""
