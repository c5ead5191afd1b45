"""kinterval.train"""
