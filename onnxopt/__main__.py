from onnxopt.guard import main

main()
